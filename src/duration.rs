//! Durations as people write them in config and on the command line: `"90s"`, `"30m"`,
//! `"1h30m"`, `"500ms"`, `"14d"`. Parsed by jiff's friendly format (which also takes
//! `"1h 30m"`, `"45 minutes"`, `"2w"`), with days and weeks counted as 24 h and 7 d; a
//! value too large for a duration is an error, never an overflow.

use std::time::Duration;

/// Why a duration does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("`{0}` needs a unit (ms, s, m, h or d)")]
    NoUnit(String),
    #[error("unknown unit `{0}` (use ms, s, m, h or d)")]
    UnknownUnit(String),
    #[error("`{0}` is negative")]
    Negative(String),
    #[error("`{0}` is too long")]
    TooLong(String),
    #[error("`{0}` is not a duration")]
    Invalid(String),
}

/// The units jiff's friendly format knows (what it accepts, not all of which fit a
/// duration: months and years have no fixed length).
const UNITS: &[&str] = &[
    "ns",
    "nsec",
    "nsecs",
    "us",
    "µs",
    "usec",
    "usecs",
    "ms",
    "msec",
    "msecs",
    "millis",
    "s",
    "sec",
    "secs",
    "second",
    "seconds",
    "m",
    "min",
    "mins",
    "minute",
    "minutes",
    "h",
    "hr",
    "hrs",
    "hour",
    "hours",
    "d",
    "day",
    "days",
    "w",
    "wk",
    "wks",
    "week",
    "weeks",
    "millisecond",
    "milliseconds",
    "microsecond",
    "microseconds",
    "nanosecond",
    "nanoseconds",
];

/// Parses a duration like `"90s"`, `"30m"`, `"1h30m"`, `"500ms"` or `"14d"`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(DurationError::Empty);
    }
    let span: jiff::Span = t.parse().map_err(|_| classify(t))?;
    let signed = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|_| classify(t))?;
    if signed.is_negative() {
        return Err(DurationError::Negative(t.to_string()));
    }
    Duration::try_from(signed).map_err(|_| DurationError::TooLong(t.to_string()))
}

/// Says what is wrong with text jiff refused, in loopflow's own words.
fn classify(t: &str) -> DurationError {
    let letters: Vec<&str> = t
        .split(|c: char| !c.is_alphabetic() && c != 'µ')
        .filter(|w| !w.is_empty())
        .collect();
    if letters.is_empty() {
        return if t
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == ' ')
        {
            DurationError::NoUnit(t.to_string())
        } else {
            DurationError::Invalid(t.to_string())
        };
    }
    if let Some(unknown) = letters.iter().find(|w| !UNITS.contains(w)) {
        return DurationError::UnknownUnit((*unknown).to_string());
    }
    // Known units and digits only: the number itself is too large.
    if t.chars().filter(char::is_ascii_digit).count() > 9 {
        return DurationError::TooLong(t.to_string());
    }
    DurationError::Invalid(t.to_string())
}

/// A duration as people write it, without spaces: `5m`, `1m30s`, `1h`, `500ms`.
pub(crate) fn human(d: Duration) -> String {
    let sd = jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX);
    format!("{sd:#}").replace(' ', "")
}

/// Parses a `--max-age` like `14d`, `12h`, `30m`, `90s`, or plain seconds (`90`).
pub(crate) fn parse_age(s: &str) -> Result<Duration, DurationError> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| DurationError::TooLong(t.to_string()));
    }
    parse_duration(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(
            parse_duration("2d").unwrap(),
            Duration::from_secs(2 * 86400)
        );
        assert_eq!(
            parse_duration("30"),
            Err(DurationError::NoUnit("30".into()))
        );
        assert_eq!(
            parse_duration("3 parsecs"),
            Err(DurationError::UnknownUnit("parsecs".into()))
        );
        assert!(matches!(
            parse_duration("-5s"),
            Err(DurationError::Negative(_))
        ));
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
    }

    /// Huge values are errors: these panicked or overflowed in the hand-written parsers.
    #[test]
    fn huge_values_are_errors_not_panics() {
        for s in [
            "99999999999999999999d",
            "99999999999999999999999999d",
            "999999999999999999d",
            "18446744073709551615s",
            "1e400s",
        ] {
            assert!(parse_duration(s).is_err(), "{s}");
        }
        assert!(parse_age("999999999999999999d").is_err());
        assert!(parse_age("99999999999999999999999").is_err());
    }

    #[test]
    fn human_form_round_trips() {
        for s in ["5m", "1m30s", "1h", "500ms", "45m"] {
            assert_eq!(human(parse_duration(s).unwrap()), s);
        }
    }

    #[test]
    fn ages() {
        assert_eq!(parse_age("14d").unwrap(), Duration::from_secs(14 * 86400));
        assert_eq!(parse_age("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_age("90").unwrap(), Duration::from_secs(90));
        assert!(parse_age("x").is_err());
    }
}
