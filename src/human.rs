//! Values as a person reads them: money, tokens, durations and scores rounded (`$0.0071`,
//! not `0.007145932000000001`), agent text made safe for a terminal, and the exact
//! `loopflow` command line a human runs next.

use std::path::Path;

/// Dollars: cents from $1 up, else two significant digits (at most four decimals), so a
/// cheap tick still shows what it cost.
pub(crate) fn usd(x: f64) -> String {
    if !x.is_finite() {
        return "$?".into();
    }
    if x == 0.0 {
        return "$0".into();
    }
    if x.abs() >= 1.0 {
        return format!("${x:.2}");
    }
    let digits = (-x.abs().log10().floor() as i32 + 1).clamp(2, 4) as usize;
    let s = format!("{x:.digits$}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "0" || s == "-0" {
        "<$0.0001".into()
    } else {
        format!("${s}")
    }
}

/// A count with thousands separators: `12,345`.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds as `45s`, `12m 5s`, `3h 20m`.
pub(crate) fn seconds(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "?".into();
    }
    let total = s.round() as u64;
    match total {
        0 if s > 0.0 => "<1s".into(),
        t if t < 60 => format!("{t}s"),
        t if t < 3600 => format!("{}m {}s", t / 60, t % 60),
        t => format!("{}h {}m", t / 3600, (t % 3600) / 60),
    }
}

/// A verdict score with two decimals.
pub(crate) fn score(x: f64) -> String {
    format!("{x:.2}")
}

/// A word quoted for a POSIX shell when it needs it, so a printed command can be pasted.
pub(crate) fn shell_word(w: &str) -> String {
    let plain = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

/// `loopflow VERB --loop NAME --project DIR`: the command a human runs next.
pub(crate) fn command(verb: &str, name: &str, project: &Path) -> String {
    format!(
        "loopflow {verb} --loop {} --project {}",
        shell_word(name),
        shell_word(&project.display().to_string())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_rounded_for_people() {
        assert_eq!(usd(0.007145932000000001), "$0.0071");
        assert_eq!(usd(0.5), "$0.5");
        assert_eq!(usd(0.123456), "$0.12");
        assert_eq!(usd(12.3456), "$12.35");
        assert_eq!(usd(0.0), "$0");
        assert_eq!(usd(0.00001), "<$0.0001");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(count(12), "12");
        assert_eq!(seconds(83.4), "1m 23s");
        assert_eq!(seconds(7300.0), "2h 1m");
        assert_eq!(seconds(0.25), "<1s");
        assert_eq!(score(0.9), "0.90");
    }

    #[test]
    fn commands_paste_into_a_shell() {
        assert_eq!(
            command("approve", "l", Path::new("/tmp/a b")),
            "loopflow approve --loop l --project '/tmp/a b'"
        );
        assert_eq!(shell_word("it's"), "'it'\\''s'");
    }
}
