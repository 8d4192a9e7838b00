//! `.state.log`: one line per event, `<RFC3339-UTC> <EVENT> <key=value …>` (DESIGN §8).
//! Values are quoted and escaped so no reason, note or agent text can forge a line, and
//! the readers here (the last `TICK`, halts logged during a tick) are bounded.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use super::{StateError, io_err, now};
use crate::fs_safe::{nofollow, refuse_hard_link_meta, regular_meta};

/// The events the log records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Create,
    Tick,
    Skip,
    Halt,
    Abort,
    Approve,
    Transition,
    Task,
    Retry,
    Compact,
    Warn,
    Error,
    Schedule,
    Worktree,
    DaemonStopped,
    Land,
    Discard,
    /// A runner took a remote loop's lease (DESIGN §16).
    Lease,
    Close,
}

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Create => "CREATE",
            Event::Tick => "TICK",
            Event::Skip => "SKIP",
            Event::Halt => "HALT",
            Event::Abort => "ABORT",
            Event::Approve => "APPROVE",
            Event::Transition => "TRANSITION",
            Event::Task => "TASK",
            Event::Retry => "RETRY",
            Event::Compact => "COMPACT",
            Event::Warn => "WARN",
            Event::Error => "ERROR",
            Event::Schedule => "SCHEDULE",
            Event::Worktree => "WORKTREE",
            Event::DaemonStopped => "DAEMON_STOPPED",
            Event::Land => "LAND",
            Event::Discard => "DISCARD",
            Event::Lease => "LEASE",
            Event::Close => "CLOSE",
        }
    }
}

/// One item after the event name: a bare word or `key=value`.
pub enum LogArg<'a> {
    Word(&'a str),
    Kv(&'a str, String),
}

/// Characters some reader treats as a line break (Rust's `lines`, Python's `splitlines`,
/// JavaScript's line terminators), or that a terminal acts on: none may reach the log raw,
/// or a reason could forge an event line.
fn breaks_lines(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Quotes a log value when it holds whitespace, quotes or `=`, so lines stay parseable.
/// Inside quotes every line-breaking character is escaped (`\n`, `\u2028`).
pub(crate) fn quote(v: &str) -> String {
    if v.is_empty()
        || v.chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '=' || breaks_lines(c))
    {
        let json = serde_json::to_string(v).unwrap_or_else(|_| "\"?\"".into());
        // serde_json leaves U+0085, U+2028, U+2029 and DEL raw; escape them too.
        let mut out = String::with_capacity(json.len());
        for c in json.chars() {
            if breaks_lines(c) {
                out.push_str(&format!("\\u{:04x}", c as u32));
            } else {
                out.push(c);
            }
        }
        out
    } else {
        v.to_string()
    }
}

/// A bare word in a log line: line-breaking characters become spaces.
fn word(w: &str) -> String {
    w.chars()
        .map(|c| if breaks_lines(c) { ' ' } else { c })
        .collect()
}

/// The text of one event line, newline included.
pub(crate) fn line(event: Event, args: &[LogArg<'_>]) -> String {
    let mut line = format!("{} {}", now(), event.as_str());
    for a in args {
        line.push(' ');
        match a {
            LogArg::Word(w) => line.push_str(&word(w)),
            LogArg::Kv(k, v) => {
                line.push_str(k);
                line.push('=');
                line.push_str(&quote(v));
            }
        }
    }
    line.push('\n');
    line
}

/// Appends one event line to the log at `path`; returns the line.
pub(crate) fn append(path: &Path, event: Event, args: &[LogArg<'_>]) -> Result<String, StateError> {
    let line = line(event, args);
    let mut f = nofollow(OpenOptions::new().create(true).append(true))
        .open(path)
        .map_err(io_err(path))?;
    // One fstat for both refusals.
    let m = f.metadata().map_err(io_err(path))?;
    refuse_hard_link_meta(&m).map_err(io_err(path))?;
    regular_meta(&m).map_err(io_err(path))?;
    // One write call per line: O_APPEND keeps concurrent writers' lines whole.
    f.write_all(line.as_bytes()).map_err(io_err(path))?;
    Ok(line)
}

/// The `iter=` of the last `TICK` line in the log's tail (the last 64 KiB); 0 when the
/// whole log was read and holds none; `None` when that cannot be known.
///
/// Read newest first: the last 4 KiB, which nearly always holds the last `TICK`, and the
/// whole tail only when it does not (decoding 64 KiB of a long log every tick cost a
/// tick ~440,000 instructions).
pub(crate) fn last_tick(path: &Path) -> Option<u64> {
    // Never a plain open: a FIFO in place of the log would block it (and the tick).
    let (mut f, len) = crate::fs_safe::open_regular_len(path).ok()?;
    let start = len.saturating_sub(64 * 1024);
    let near = len.saturating_sub(4 * 1024);
    if near > start {
        let bytes = read_range(&mut f, near, len)?;
        // The chunk's first line may be cut: only the lines after it count here.
        let whole = bytes
            .iter()
            .position(|b| *b == b'\n')
            .map_or(&[][..], |i| &bytes[i + 1..]);
        if let Some(n) = last_tick_in(whole) {
            return Some(n);
        }
    }
    let bytes = read_range(&mut f, start, len)?;
    last_tick_in(&bytes).or((start == 0).then_some(0))
}

fn read_range(f: &mut File, from: u64, to: u64) -> Option<Vec<u8>> {
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut buf = Vec::new();
    crate::fs_safe::read_capped(f, to - from, to - from, &mut buf).ok()?;
    Some(buf)
}

/// The `iter=` of the last `TICK` line among `lines` (newline-separated, `\r\n` too).
fn last_tick_in(lines: &[u8]) -> Option<u64> {
    lines.split(|b| *b == b'\n').rev().find_map(|l| {
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        let mut words = l.split(|b| *b == b' ');
        words.next()?; // the time
        if words.next()? != Event::Tick.as_str().as_bytes() {
            return None;
        }
        words.find_map(|w| {
            std::str::from_utf8(w.strip_prefix(b"iter=")?)
                .ok()?
                .parse()
                .ok()
        })
    })
}

/// The most recent halt logged at or after byte `start` (by `loopflow halt` during a
/// tick), for when the state file no longer shows it. `None` when there is none.
pub(crate) fn halt_since(path: &Path, start: u64) -> Option<String> {
    // Never a plain open: a FIFO in place of the log would block it (and the tick).
    let (mut f, len) = crate::fs_safe::open_regular_len(path).ok()?;
    // Bounded: the newest 4 MiB of this tick's events at most.
    let from = start.max(len.saturating_sub(4 << 20));
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut bytes = Vec::new();
    crate::fs_safe::read_capped(&mut f, len.saturating_sub(from), 4 << 20, &mut bytes).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let prefix = format!("{} ", Event::Halt.as_str());
    text.lines()
        .filter_map(|l| l.split_once(' ').map(|(_, rest)| rest))
        .filter_map(|rest| rest.strip_prefix(prefix.as_str()))
        .map(|r| r.split(" detail=\"").next().unwrap_or(r).to_string())
        .next_back()
}

/// One event line, read back: `<at> <EVENT> <words…> <key=value…>` with quoted values
/// unescaped (what `log --json` prints).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Entry {
    pub at: String,
    pub event: String,
    /// `key=value` items, in order; values are strings.
    pub args: indexmap::IndexMap<String, String>,
    /// The bare words (a free-text halt reason spans several: join them with spaces).
    pub words: Vec<String>,
}

/// Parses one log line (without its newline); `None` when it is not an event line (a
/// line someone else appended, a torn write).
pub(crate) fn parse_line(line: &str) -> Option<Entry> {
    let (at, rest) = line.split_once(' ')?;
    at.parse::<jiff::Timestamp>().ok()?;
    let (event, mut rest) = rest.split_once(' ').unwrap_or((rest, ""));
    if event.is_empty() || !event.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
        return None;
    }
    let mut e = Entry {
        at: at.to_string(),
        event: event.to_string(),
        args: indexmap::IndexMap::new(),
        words: Vec::new(),
    };
    while !rest.is_empty() {
        let token_end = rest.find(' ').unwrap_or(rest.len());
        let key = rest[..token_end].split_once('=').map(|(k, _)| k);
        match key {
            Some(k)
                if !k.is_empty()
                    && k.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') =>
            {
                let v = &rest[k.len() + 1..];
                let (value, after) = if v.starts_with('"') {
                    let end = quoted_end(v)?;
                    (serde_json::from_str::<String>(&v[..end]).ok()?, &v[end..])
                } else {
                    let end = v.find(' ').unwrap_or(v.len());
                    (v[..end].to_string(), &v[end..])
                };
                e.args.insert(k.to_string(), value);
                rest = after;
            }
            _ => {
                e.words.push(rest[..token_end].to_string());
                rest = &rest[token_end..];
            }
        }
        // Items are separated by one space; anything else glued on is not our line.
        match rest.strip_prefix(' ') {
            Some(r) => rest = r,
            None if rest.is_empty() => {}
            None => return None,
        }
    }
    Some(e)
}

/// The byte just past the closing quote of the JSON string `v` starts with.
fn quoted_end(v: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, b) in v.bytes().enumerate().skip(1) {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// The last `event` line in the log's tail (the last 64 KiB), parsed.
/// Whether the loop's standing halt has its `HALT` line: the log's last `HALT` or
/// `APPROVE` event is a `HALT` (an approval clears a halt, so a halt set after the last
/// approval needs a line after it). `Some(false)` when the last of them is an `APPROVE`,
/// or when the whole log was read and holds neither; `None` when the last 64 KiB hold
/// neither of a longer log (rotated, or too long ago to tell). Order, not times, decides:
/// a halt the commit restored carries the time of its restoring, later than its line.
pub(crate) fn halt_logged(path: &Path) -> Option<bool> {
    const TAIL: u64 = 64 * 1024;
    let buf = crate::fs_safe::tail(path, TAIL).ok()?;
    let whole = (buf.len() as u64) < TAIL;
    let text = String::from_utf8_lossy(&buf);
    // A tail that starts mid-file starts mid-line: that fragment is no event.
    let lines = text.lines().skip(usize::from(!whole));
    let last = lines
        .filter_map(parse_line)
        .filter(|e| {
            e.event == Event::Halt.as_str()
                || e.event == Event::Close.as_str()
                || e.event == Event::Approve.as_str()
        })
        .last();
    // `CLOSE` records a halt too (`closed`), written by the human who set it.
    match last {
        Some(e) => Some(e.event != Event::Approve.as_str()),
        None => whole.then_some(false),
    }
}

/// The newest `event` line among the log's last 64 KiB.
pub(crate) fn last_event(path: &Path, event: Event) -> Option<Entry> {
    let buf = crate::fs_safe::tail(path, 64 * 1024).ok()?;
    String::from_utf8_lossy(&buf)
        .lines()
        .rev()
        .filter_map(parse_line)
        .find(|e| e.event == event.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A halt's line is the log's last HALT or APPROVE; missing when an approval came
    /// after it or the whole log has neither; unknown when a long log's tail has neither.
    #[test]
    fn halt_logged_tells_missing_from_rotated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".state.log");
        for (log, want) in [
            (
                "2026-11-30T09:00:00Z CREATE template=default\n2026-11-30T10:00:00Z TICK iter=1\n2026-11-30T10:00:00Z HALT goal_met\n2026-11-30T11:00:00Z SKIP reason=halted:goal_met\n",
                Some(true),
            ),
            (
                "2026-11-30T09:00:00Z CREATE template=default\n2026-11-30T10:00:00Z TICK iter=1\n",
                Some(false),
            ),
            // Halted, approved, halted again without its line.
            (
                "2026-11-30T09:00:00Z HALT plateau\n2026-11-30T09:30:00Z APPROVE by=me\n2026-11-30T09:40:00Z TICK iter=2\n",
                Some(false),
            ),
            ("", Some(false)),
        ] {
            std::fs::write(&p, log).unwrap();
            assert_eq!(halt_logged(&p), want, "{log}");
        }
        // A long log whose last 64 KiB hold neither: unknown. The tail starts inside a
        // line whose rest reads like a HALT: a cut line is no event.
        let frag = "2026-11-30T09:00:00Z HALT forged\"\n";
        let filler_line = "2026-11-30T09:00:00Z WARN msg=\"filler\"\n";
        let mut filler = filler_line.repeat((65_536 - frag.len()) / filler_line.len() - 1);
        // One line of padding makes the tail exactly 64 KiB from the fragment on.
        let pad = 65_536 - frag.len() - filler.len();
        let head = "2026-11-30T09:00:00Z WARN msg=\"";
        filler.insert_str(
            0,
            &format!("{head}{}\"\n", "p".repeat(pad - head.len() - 2)),
        );
        let long = format!("2026-11-30T08:00:00Z WARN msg=\"cut here: {frag}{filler}");
        assert_eq!(
            long.len() - long.find(frag).unwrap(),
            65_536,
            "the tail starts at the fragment"
        );
        std::fs::write(&p, &long).unwrap();
        assert_eq!(halt_logged(&p), None);
        assert_eq!(halt_logged(&dir.path().join("none")), None);
    }

    /// The last `TICK` is found wherever it sits in the 64 KiB tail, and only there.
    #[test]
    fn last_tick_reads_the_tail_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".state.log");
        let filler = |n: usize| -> String {
            (0..n)
                .map(|i| format!("2026-11-30T00:00:00Z WARN msg=\"filler {i:06}\"\n"))
                .collect()
        };
        std::fs::write(&p, "").unwrap();
        assert_eq!(last_tick(&p), Some(0));
        let tick = "2026-11-30T00:00:00Z TICK pass=true score=0.5 iter=7\r\n";
        for (before, after, want) in [
            (0, 10, Some(7)),   // small log, near the end
            (10, 40, Some(7)),  // within the last 4 KiB
            (10, 400, Some(7)), // past 4 KiB, within 64 KiB
            (10, 3000, None),   // past the 64 KiB tail: unknown
        ] {
            std::fs::write(&p, format!("{}{tick}{}", filler(before), filler(after))).unwrap();
            assert_eq!(last_tick(&p), want, "{before} {after}");
        }
        std::fs::write(&p, filler(3000)).unwrap();
        assert_eq!(last_tick(&p), None);
        std::fs::write(&p, filler(30)).unwrap();
        assert_eq!(last_tick(&p), Some(0));
    }

    #[test]
    fn quoting() {
        assert_eq!(quote("abc"), "abc");
        assert_eq!(quote("extend 5"), "\"extend 5\"");
        assert_eq!(quote(""), "\"\"");
        assert_eq!(quote("a\u{2028}b"), "\"a\\u2028b\"");
        assert_eq!(quote("a\u{85}b\u{b}"), "\"a\\u0085b\\u000b\"");
        assert_eq!(word("a\u{2029}b\rc\u{c}"), "a b c ");
    }

    #[test]
    fn lines_parse_back_with_quoted_values_unescaped() {
        let text = line(
            Event::Halt,
            &[
                LogArg::Word("waiting for review"),
                LogArg::Kv("detail", "a \"b\" c\u{2028}=d\\".into()),
                LogArg::Kv("iter", "3".into()),
            ],
        );
        let e = parse_line(text.trim_end_matches('\n')).expect("parses");
        assert_eq!(e.event, "HALT");
        assert_eq!(e.words, ["waiting", "for", "review"]);
        assert_eq!(e.args["detail"], "a \"b\" c\u{2028}=d\\");
        assert_eq!(e.args["iter"], "3");
        assert_eq!(
            parse_line("2026-11-30T02:10:00Z TICK pass=true score=0.9 iter=1")
                .map(|e| e.args.len()),
            Some(3)
        );
        for bad in [
            "",
            "garbage",
            "2026-11-30T02:10:00Z tick x",
            "not-a-time TICK iter=1",
            "2026-11-30T02:10:00Z HALT detail=\"unterminated",
            "2026-11-30T02:10:00Z HALT detail=\"x\"glued",
        ] {
            assert_eq!(parse_line(bad), None, "{bad}");
        }
    }
}
