//! cron: one crontab line wrapped in `flock -n` so ticks never overlap; intervals cron
//! cannot express are rounded to the nearest one it can, with a comment. Installing edits
//! a marked block of the user's crontab.

use super::{File, ScheduleError, Target, tool_input, which};

/// A cron expression for an interval: the nearest one cron can express.
pub(crate) struct CronSchedule {
    pub expr: String,
    /// How often it really fires, in seconds and in words ("every 5 min").
    pub every_secs: u64,
    pub every: String,
    /// Set when it is not the interval asked for.
    pub note: Option<String>,
}

/// The 5-field cron expression nearest to `secs`, and a note when it is not exact.
pub(super) fn cron_expr(secs: u64) -> (String, Option<String>) {
    let c = cron_schedule(secs);
    (c.expr, c.note)
}

pub(super) fn cron_schedule(secs: u64) -> CronSchedule {
    let mins = secs.div_ceil(60).max(1);
    let exact = secs.is_multiple_of(60) && secs >= 60;
    let made = |expr: String, every_secs: u64, every: String, note: Option<String>| CronSchedule {
        expr,
        every_secs,
        every,
        note,
    };
    if mins < 60 {
        // Minute steps must divide 60 to be regular.
        let step = [1u64, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30]
            .into_iter()
            .min_by_key(|s| s.abs_diff(mins))
            .unwrap_or(1);
        let expr = if step == 1 {
            "* * * * *".to_string()
        } else {
            format!("*/{step} * * * *")
        };
        let note = (!exact || step != mins)
            .then(|| format!("cron cannot fire every {secs} s; this fires every {step} min"));
        return made(expr, step * 60, format!("every {step} min"), note);
    }
    let hours = mins.div_ceil(60);
    if hours < 24 {
        let step = [1u64, 2, 3, 4, 6, 8, 12]
            .into_iter()
            .min_by_key(|s| s.abs_diff(hours))
            .unwrap_or(1);
        let expr = if step == 1 {
            "0 * * * *".to_string()
        } else {
            format!("0 */{step} * * *")
        };
        let note = (secs != step * 3600)
            .then(|| format!("cron cannot fire every {secs} s; this fires every {step} h"));
        return made(expr, step * 3600, format!("every {step} h"), note);
    }
    let note =
        (secs != 86400).then(|| format!("cron cannot fire every {secs} s; this fires once a day"));
    made("0 0 * * *".to_string(), 86400, "once a day".into(), note)
}

/// A loop's cron expression with its minute (and, once a day, its hour) scattered by a
/// hash of `key` (the loop's name): never `0 *`, which GitHub delays and drops under
/// load, and not every loop at once. Also the firing's offset into each period, in
/// seconds, which `run --slot auto` uses to name the slot a firing is for.
pub(crate) fn scattered(secs: u64, key: &str) -> (CronSchedule, u64) {
    let mut c = cron_schedule(secs);
    let h = super::fnv32(std::path::Path::new(key)) as u64;
    let step = c.every_secs / 60;
    let offset = if step < 60 {
        if step <= 1 {
            return (c, 0);
        }
        let m = h % step;
        c.expr = format!("{m}-59/{step} * * * *");
        m * 60
    } else if step < 24 * 60 {
        let m = 1 + h % 59;
        c.expr = match step / 60 {
            1 => format!("{m} * * * *"),
            k => format!("{m} */{k} * * *"),
        };
        m * 60
    } else {
        let (m, hour) = (1 + h % 59, (h / 59) % 24);
        c.expr = format!("{m} {hour} * * *");
        hour * 3600 + m * 60
    };
    (c, offset)
}

/// POSIX sh single quoting, and `%` escaped (cron turns a bare `%` into a newline).
pub(super) fn sh_quote(a: &str) -> String {
    format!("'{}'", a.replace('\'', "'\\''")).replace('%', "\\%")
}

/// The crontab line: cron's `/bin/sh` runs `flock -n LOCK <exe> run …`; a tick still
/// running makes the next one exit at once instead of piling up.
pub(super) fn cron_line(t: &Target) -> String {
    let (expr, _) = cron_expr(t.interval);
    let lock = t.loop_dir.join(".schedule.lock");
    let argv: Vec<String> = t.argv().iter().map(|a| sh_quote(a)).collect();
    let env: String = t
        .env
        .iter()
        .map(|(k, v)| format!("{k}={} ", sh_quote(v)))
        .collect();
    match which("flock") {
        Some(flock) => format!(
            "{expr} {env}{} -n {} {} >/dev/null",
            sh_quote(&flock.display().to_string()),
            sh_quote(&lock.display().to_string()),
            argv.join(" ")
        ),
        // No flock (macOS): loopflow's own lock still keeps ticks apart (SKIP reason=locked).
        None => format!("{expr} {env}{} >/dev/null", argv.join(" ")),
    }
}

pub(super) fn cron(t: &Target) -> File {
    let (_, note) = cron_expr(t.interval);
    let mut text = format!(
        "# loopflow: loop {} in {} every {} s\n",
        t.loop_name,
        t.project.display(),
        t.interval
    );
    if let Some(n) = note {
        text.push_str(&format!("# note: {n}\n"));
    }
    if which("flock").is_none() {
        text.push_str("# note: flock is not installed; an overlapping tick logs SKIP reason=locked and exits\n");
    }
    text.push_str(&cron_line(t));
    text.push('\n');
    File {
        name: format!("{}.crontab", t.label()),
        text,
    }
}

pub(super) const CRON_BEGIN: &str = "# loopflow:";

pub(super) fn cron_markers(label: &str) -> (String, String) {
    (
        format!("{CRON_BEGIN}{label} begin (managed by `loopflow schedule`; edit with it)"),
        format!("{CRON_BEGIN}{label} end"),
    )
}

/// The current crontab; an absent crontab (`no crontab for user`) is empty.
pub(super) fn crontab_read() -> Result<String, ScheduleError> {
    let out =
        crate::process::tool::run(&["crontab", "-l"], None, crate::process::tool::TOOL_TIMEOUT)
            .map_err(|e| ScheduleError::Tool(format!("`crontab -l`: {e} (is cron installed?)")))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("no crontab") {
        Ok(String::new())
    } else {
        Err(ScheduleError::Tool(format!("`crontab -l`: {}", err.trim())))
    }
}

/// The crontab with this label's block removed.
pub(super) fn cron_without(text: &str, label: &str) -> String {
    let (b, e) = cron_markers(label);
    let begin_prefix = b.split(" begin").next().unwrap_or(&b).to_string() + " begin";
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with(&begin_prefix) {
            inside = true;
            continue;
        }
        if inside {
            if line == e {
                inside = false;
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Replaces this label's block with `body` (or removes it) via `crontab -`.
pub(super) fn crontab_set(label: &str, body: Option<&str>) -> Result<(), ScheduleError> {
    let current = crontab_read()?;
    let mut next = cron_without(&current, label);
    if let Some(body) = body {
        let (b, e) = cron_markers(label);
        next.push_str(&format!("{b}\n{body}\n{e}\n"));
    }
    if next == current {
        return Ok(());
    }
    tool_input(&["crontab", "-"], Some(&next)).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_expressions() {
        assert_eq!(cron_expr(60).0, "* * * * *");
        assert_eq!(cron_expr(300), ("*/5 * * * *".into(), None));
        assert_eq!(cron_expr(3600), ("0 * * * *".into(), None));
        assert_eq!(cron_expr(7200), ("0 */2 * * *".into(), None));
        assert_eq!(cron_expr(86400), ("0 0 * * *".into(), None));
        assert!(cron_expr(10).1.is_some());
        assert!(cron_expr(420).1.is_some());
    }

    #[test]
    fn cron_block_roundtrip() {
        let (b, e) = cron_markers("l");
        let text = format!("MAILTO=x\n{b}\n* * * * * a\n{e}\n0 0 * * * other\n");
        assert_eq!(cron_without(&text, "l"), "MAILTO=x\n0 0 * * * other\n");
    }
}
