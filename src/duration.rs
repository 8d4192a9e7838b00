//! Durations as people write them in config and on the command line: `"90s"`, `"30m"`,
//! `"1h30m"`, `"500ms"`, `"14d"`.

use std::time::Duration;

/// Parses a duration like `"90s"`, `"30m"`, `"1h30m"` or `"500ms"`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let mut total = 0f64;
    let mut rest = t;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("`{t}` is not a duration"));
        }
        let n: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("`{t}` is not a duration"))?;
        rest = rest[num_len..].trim_start();
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        let factor = match unit {
            "ms" => 0.001,
            "s" | "sec" | "secs" => 1.0,
            "m" | "min" | "mins" => 60.0,
            "h" | "hr" | "hrs" => 3600.0,
            "d" => 86400.0,
            "" => return Err(format!("`{t}` needs a unit (ms, s, m, h or d)")),
            other => return Err(format!("unknown unit `{other}` (use ms, s, m, h or d)")),
        };
        total += n * factor;
        rest = rest[unit_len..].trim_start();
    }
    Ok(Duration::from_secs_f64(total))
}

/// Parses `14d`, `12h`, `30m`, `90s` or plain seconds.
pub fn parse_age(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'd')) => (&s[..i], 86400),
        Some((i, 'h')) => (&s[..i], 3600),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 's')) => (&s[..i], 1),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| Duration::from_secs(n * mult))
        .map_err(|_| format!("invalid age `{s}`: use e.g. 14d, 12h, 30m or 90s"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("3 parsecs").is_err());
    }

    #[test]
    fn ages() {
        assert_eq!(parse_age("14d").unwrap(), Duration::from_secs(14 * 86400));
        assert_eq!(parse_age("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_age("90").unwrap(), Duration::from_secs(90));
        assert!(parse_age("x").is_err());
    }
}
