//! Provider usage and rate limits (DESIGN §10): how each preset's CLI says its provider
//! refused it (`[limit]`), when it may try again, and the record that makes every loop
//! using the same preset and credential — in any project — skip until then. The record
//! lives in `$XDG_STATE_HOME/loopflow/limits/<preset>-<hash of the credential>.json`,
//! outside every sandbox; the credential itself is never written anywhere.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::usage::{Filter, OutputFormat};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::toml_read::Table;

/// How long a limit stands when the CLI names no reset time.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(15 * 60);

/// The longest a reset time read from a message is believed (a misread date must not
/// stop a loop for a year).
const MAX_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where a CLI reports a limit.
#[derive(Debug, Clone, PartialEq)]
pub enum LimitSource {
    Stdout,
    Stderr,
    /// A log file of its own, relative to the loop's agent state.
    Log(String),
}

/// A preset's `[limit]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitRule {
    pub from: LimitSource,
    pub format: OutputFormat,
    /// JSON sources: documents whose pointers hold these values.
    pub when: Option<Filter>,
    /// JSON sources: a pointer to the message; logs: the text after which it starts.
    pub message: Option<String>,
    /// The message (or log line) holds one of these, case-insensitively.
    pub phrases: Vec<String>,
    /// Logs: only lines that hold every one of these.
    pub lines: Vec<String>,
    /// Read while the agent runs: a CLI that waits out the limit itself is stopped.
    pub watch: bool,
    pub wait: Duration,
}

impl LimitRule {
    pub fn read(t: &Table<'_, '_>, diags: &mut Diagnostics) -> Option<LimitRule> {
        t.deny_unknown(
            &[
                "from", "format", "when", "message", "match", "lines", "watch", "wait",
            ],
            diags,
        );
        let from = match t.str("from", diags) {
            None => LimitSource::Stdout,
            Some(s) => match s.value.as_str() {
                "stdout" => LimitSource::Stdout,
                "stderr" => LimitSource::Stderr,
                v if v.starts_with("log:") => LimitSource::Log(v["log:".len()..].to_string()),
                other => {
                    diags.push(
                        Diagnostic::error(
                            Code::InvalidValue,
                            t.source,
                            s.span,
                            format!("`limit.from` cannot be `{other}`"),
                        )
                        .label("not a source")
                        .help("use \"stdout\", \"stderr\" or \"log:<path in the agent's state>\""),
                    );
                    return None;
                }
            },
        };
        let format = match t.str("format", diags).as_ref().map(|s| s.value.as_str()) {
            Some("jsonl") => OutputFormat::Jsonl,
            _ => OutputFormat::Json,
        };
        let when = t.table("when", diags).map(|w| {
            Filter(
                w.scalars(diags)
                    .into_iter()
                    .map(|(k, v)| (k.value, v))
                    .collect(),
            )
        });
        let list = |key: &str, diags: &mut Diagnostics| {
            t.str_list(key, diags)
                .map(|(v, _)| v.into_iter().map(|s| s.value).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        Some(LimitRule {
            from,
            format,
            when,
            message: t.str("message", diags).map(|s| s.value),
            phrases: list("match", diags)
                .into_iter()
                .map(|p| p.to_lowercase())
                .collect(),
            lines: list("lines", diags),
            watch: t.bool("watch", diags).unwrap_or(false),
            wait: t.duration("wait", diags).unwrap_or(DEFAULT_WAIT),
        })
    }

    /// The CLI's own words about the limit, when `text` (its stdout, stderr or log,
    /// as `from` says) reports one.
    pub fn detect(&self, text: &str) -> Option<String> {
        let said = |m: &str| {
            self.phrases.is_empty() || {
                let low = m.to_lowercase();
                self.phrases.iter().any(|p| low.contains(p.as_str()))
            }
        };
        if let LimitSource::Log(_) = self.from {
            return text.lines().rev().find_map(|l| {
                if !self.lines.iter().all(|w| l.contains(w.as_str())) || !said(l) {
                    return None;
                }
                let msg = match &self.message {
                    Some(after) => l.split_once(after.as_str()).map_or(l, |(_, m)| m),
                    None => l,
                };
                Some(msg.trim().trim_end_matches('"').to_string())
            });
        }
        documents(self.format, text).iter().rev().find_map(|d| {
            if !self.when.as_ref().is_none_or(|f| f.admits(d)) {
                return None;
            }
            let msg = match self.message.as_deref().and_then(|p| d.pointer(p)) {
                Some(Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
                None => d.to_string(),
            };
            said(&msg).then_some(msg)
        })
    }
}

/// The JSON documents of a stream: every line that is one (`jsonl`), or the whole text —
/// failing that, the last document that starts a line (a CLI that prints log lines, then
/// its JSON result, on stderr).
fn documents(format: OutputFormat, text: &str) -> Vec<Value> {
    match format {
        OutputFormat::Jsonl => text
            .lines()
            .filter_map(|l| serde_json::from_str(l.trim()).ok())
            .collect(),
        OutputFormat::Json => {
            if let Ok(v) = serde_json::from_str(text.trim()) {
                return vec![v];
            }
            let starts = text
                .match_indices("\n{")
                .map(|(i, _)| i + 1)
                .chain(text.starts_with('{').then_some(0));
            let mut starts: Vec<usize> = starts.collect();
            starts.sort_unstable();
            starts
                .into_iter()
                .rev()
                .find_map(|i| serde_json::from_str(text[i..].trim()).ok())
                .into_iter()
                .collect()
        }
    }
}

/// When the provider says it will take requests again, read from its message: "retry
/// after 3600s", "try again in 2 hours 5 minutes", "Please retry in 20s", "try again at
/// 3:51 PM" (the next such time, local), or a Unix time after `|`. `None` when it names
/// none.
pub(crate) fn reset_in(message: &str, now: &jiff::Zoned) -> Option<jiff::Timestamp> {
    let low = message.to_lowercase();
    let words: Vec<&str> = low
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .filter(|w| !w.is_empty())
        .collect();
    for (i, w) in words.iter().enumerate() {
        if matches!(*w, "in" | "after")
            && let Some(secs) = duration_words(&words[i + 1..])
        {
            return now
                .timestamp()
                .checked_add(jiff::SignedDuration::from_secs(secs))
                .ok();
        }
        // "try again at 3:51 PM"; Claude Code's plans: "resets 3pm".
        if matches!(*w, "at" | "resets")
            && let Some(t) = clock(&words[i + 1..], now)
        {
            return Some(t);
        }
    }
    // Claude Code's older "Claude AI usage limit reached|1735689600".
    let (_, tail) = message.rsplit_once('|')?;
    let secs: i64 = tail.trim().parse().ok()?;
    (secs > 1_000_000_000)
        .then(|| jiff::Timestamp::from_second(secs).ok())
        .flatten()
}

/// `3600s`, `20 seconds`, `2 hours 5 minutes`, `1h30m`: seconds in all.
fn duration_words(words: &[&str]) -> Option<i64> {
    let unit = |u: &str| -> Option<i64> {
        let u = u.trim_end_matches('.');
        Some(match u {
            "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86400,
            _ => return None,
        })
    };
    let mut total: i64 = 0;
    let mut seen = false;
    let mut i = 0;
    while i < words.len() {
        let w = words[i].trim_end_matches('.');
        // `1h30m`, `3600s`, `20.5s`: number-unit pairs inside one word.
        let mut rest = w;
        let mut matched = false;
        while !rest.is_empty() {
            let n_end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            if n_end == 0 {
                break;
            }
            let Ok(n) = rest[..n_end].parse::<f64>() else {
                break;
            };
            let after = &rest[n_end..];
            let u_end = after
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(after.len());
            let mult = if u_end == 0 {
                // A bare number: its unit is the next word.
                let m = words.get(i + 1).and_then(|u| unit(u))?;
                i += 1;
                m
            } else {
                unit(&after[..u_end])?
            };
            total = total.saturating_add((n * mult as f64).ceil() as i64);
            seen = true;
            matched = true;
            rest = &after[u_end..];
        }
        if !matched {
            break;
        }
        i += 1;
        if words.get(i).is_some_and(|w| *w == "and") {
            i += 1;
        }
    }
    seen.then_some(total)
}

/// `3:51 pm` / `15:51` as the next such local time after `now`.
fn clock(words: &[&str], now: &jiff::Zoned) -> Option<jiff::Timestamp> {
    let first = words.first()?.trim_end_matches('.');
    // `3pm` is `3:00pm`.
    let padded;
    let first = if first.contains(':') {
        first
    } else {
        let digits = first
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(first.len());
        if digits == 0 || !matches!(&first[digits..], "am" | "pm") {
            return None;
        }
        padded = format!("{}:00{}", &first[..digits], &first[digits..]);
        padded.as_str()
    };
    let (h, m) = first.split_once(':')?;
    let mut hour: i8 = h.parse().ok()?;
    let (m, suffix) = m.split_at(m.find(|c: char| !c.is_ascii_digit()).unwrap_or(m.len()));
    let minute: i8 = m.parse().ok()?;
    let ampm = if suffix.is_empty() {
        words.get(1).map(|w| w.trim_end_matches('.')).unwrap_or("")
    } else {
        suffix
    };
    match ampm {
        "pm" | "p.m" if hour < 12 => hour += 12,
        "am" | "a.m" if hour == 12 => hour = 0,
        _ => {}
    }
    let today = now
        .date()
        .at(hour, minute, 0, 0)
        .to_zoned(now.time_zone().clone())
        .ok()?;
    let t = if today.timestamp() > now.timestamp() {
        today
    } else {
        today.checked_add(jiff::Span::new().days(1)).ok()?
    };
    Some(t.timestamp())
}

/// When a limit reported at `now` lifts: the message's reset time (never past, at most a
/// week away), else `now` plus the preset's default wait.
pub(crate) fn until(message: &str, wait: Duration, now: &jiff::Zoned) -> jiff::Timestamp {
    let at = now.timestamp();
    let fallback = at
        .checked_add(jiff::SignedDuration::from_secs(wait.as_secs() as i64))
        .unwrap_or(at);
    let Some(t) = reset_in(message, now) else {
        return fallback;
    };
    let max = at
        .checked_add(jiff::SignedDuration::from_secs(MAX_WAIT.as_secs() as i64))
        .unwrap_or(at);
    let min = at
        .checked_add(jiff::SignedDuration::from_secs(60))
        .unwrap_or(at);
    t.clamp(min, max)
}

/// A standing limit, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub preset: String,
    /// RFC 3339 UTC.
    pub until: String,
    pub at: String,
    /// The CLI's own words.
    pub message: String,
    /// The loop that hit it (`<project>:<loop>`).
    pub hit_by: String,
}

impl Record {
    /// When it lifts.
    pub(crate) fn until_ts(&self) -> Option<jiff::Timestamp> {
        self.until.parse().ok()
    }

    fn standing(&self, now: jiff::Timestamp) -> bool {
        self.until_ts().is_some_and(|u| u > now)
    }
}

/// A short, stable name for the credential a preset's agent would use: its key variables'
/// values when any is set, else which login files it would copy. Hashed; the credential
/// itself is never stored or shown.
pub(crate) fn credential_key(preset: &super::Preset) -> String {
    let mut h = blake3::Hasher::new();
    let mut any = false;
    for var in &preset.secrets {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            h.update(var.as_bytes());
            h.update(b"=");
            h.update(v.as_encoded_bytes());
            h.update(b"\0");
            any = true;
        }
    }
    if !any {
        for seed in preset.state.logins() {
            if let Some(p) = super::home::source(seed).filter(|p| p.exists()) {
                h.update(p.as_os_str().as_encoded_bytes());
                h.update(b"\0");
            }
        }
    }
    h.finalize().to_hex()[..16].to_string()
}

fn dir() -> Option<PathBuf> {
    crate::state::machine::base().map(|b| b.join("limits"))
}

fn path_for(preset: &super::Preset) -> Option<PathBuf> {
    dir().map(|d| d.join(format!("{}-{}.json", preset.name, credential_key(preset))))
}

/// The limit standing now for `preset` with the credential it would use, if any.
pub(crate) fn standing(preset: &super::Preset) -> Option<Record> {
    let p = path_for(preset)?;
    let text = crate::fs_safe::read_to_string(&p).ok()?;
    let r: Record = serde_json::from_str(&text).ok()?;
    r.standing(jiff::Timestamp::now()).then_some(r)
}

/// The standing limit that lifts last among `presets`, if any stands.
pub(crate) fn standing_any(presets: &[std::sync::Arc<super::Preset>]) -> Option<Record> {
    presets
        .iter()
        .filter_map(|p| standing(p))
        .max_by_key(|r| r.until_ts())
}

/// Records a limit for every loop of `preset` with this credential.
pub(crate) fn record(preset: &super::Preset, r: &Record) -> std::io::Result<PathBuf> {
    let p = path_for(preset)
        .ok_or_else(|| std::io::Error::other("neither XDG_STATE_HOME nor HOME is set"))?;
    let d = p.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(d)?;
    let json = serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?;
    crate::fs_safe::write_atomic(d, &p, &json)?;
    Ok(p)
}

/// RFC 3339 UTC, to the second.
pub(crate) fn rfc3339(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> jiff::Zoned {
        "2026-12-07T14:00:00+00:00[UTC]".parse().expect("zoned")
    }

    fn secs_after(message: &str) -> Option<i64> {
        let n = now();
        reset_in(message, &n).map(|t| t.as_second() - n.timestamp().as_second())
    }

    #[test]
    fn reset_times_read_from_each_clis_words() {
        // Gemini CLI, Codex (rate limit), OpenAI's message, a spelled-out wait.
        assert_eq!(
            secs_after("Please retry in 3600s.\nSuggested retry after 3600s."),
            Some(3600)
        );
        assert_eq!(
            secs_after("Rate limit reached ... Please try again in 20s. Visit"),
            Some(20)
        );
        assert_eq!(secs_after("try again in 2 hours 5 minutes."), Some(7500));
        assert_eq!(secs_after("retry in 1h30m"), Some(5400));
        assert_eq!(secs_after("try again in 1.5s"), Some(2));
        // Codex with a ChatGPT plan: a clock time, the next one.
        assert_eq!(secs_after("or try again at 3:51 PM."), Some(3600 + 51 * 60));
        assert_eq!(secs_after("try again at 1:00 PM"), Some(23 * 3600));
        assert_eq!(
            secs_after("You've hit your session limit · resets 5pm (UTC)"),
            Some(3 * 3600)
        );
        assert_eq!(secs_after("resets at 4am"), Some(14 * 3600));
        let epoch = now().timestamp().as_second() + 86400;
        assert_eq!(
            secs_after(&format!("Claude AI usage limit reached|{epoch}")),
            Some(86400)
        );
        // No time: the preset's default.
        assert_eq!(
            secs_after("API Error: Request rejected (429) · rate limit"),
            None
        );
        assert_eq!(secs_after("check back in a while"), None);
        let n = now();
        let u = until("nothing", DEFAULT_WAIT, &n);
        assert_eq!(u.as_second() - n.timestamp().as_second(), 900);
        // A year away is believed for a week at most.
        let u = until("try again in 400 days", DEFAULT_WAIT, &n);
        assert_eq!(u.as_second() - n.timestamp().as_second(), 7 * 86400);
    }

    fn rule(from: LimitSource, format: OutputFormat) -> LimitRule {
        LimitRule {
            from,
            format,
            when: None,
            message: None,
            phrases: Vec::new(),
            lines: Vec::new(),
            watch: false,
            wait: DEFAULT_WAIT,
        }
    }

    #[test]
    fn a_json_result_after_log_lines_on_stderr_is_found() {
        let mut r = rule(LimitSource::Stderr, OutputFormat::Json);
        r.when = Some(Filter(vec![("/error/code".into(), serde_json::json!(429))]));
        r.message = Some("/error/message".into());
        let err = "Warning: x\n  at y {\n  cause: {}\n}\n{\n  \"error\": {\"code\": 429, \"message\": \"retry after 5s\"}\n}";
        assert_eq!(r.detect(err).as_deref(), Some("retry after 5s"));
        assert_eq!(r.detect("{\"error\": {\"code\": 500}}"), None);
    }

    #[test]
    fn log_lines_need_every_marker_and_a_phrase() {
        let mut r = rule(LimitSource::Log("log".into()), OutputFormat::Json);
        r.lines = vec!["stream error".into()];
        r.phrases = vec!["rate limit".into()];
        r.message = Some("error.error=\"".into());
        let log = "level=INFO message=\"rate limit docs\"\nlevel=ERROR message=\"stream error\" error.error=\"AI_APICallError: Rate limit reached. Please try again in 3600s.\"\n";
        assert_eq!(
            r.detect(log).as_deref(),
            Some("AI_APICallError: Rate limit reached. Please try again in 3600s.")
        );
        assert_eq!(
            r.detect("level=ERROR message=\"stream error\" error=\"boom\""),
            None
        );
    }
}
