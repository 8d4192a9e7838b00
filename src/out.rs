//! What the commands print: stdout carries data and goes quiet when its reader leaves
//! (`loopflow status | head -0`), `--json` documents are terminal-safe, and text that
//! came from the state, the log or an agent is escaped before a terminal sees it.
//!
//! Why not restore SIGPIPE's default disposition instead: it would also apply to every
//! pipe and socket the process writes to — an agent's stdin, the dashboard's clients —
//! and kill a tick half-way. A closed stdout only silences stdout: the command finishes
//! its work (a tick commits, `init` writes everything) and exits with its own code.

use std::borrow::Cow;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Stdout's reader has gone (or stdout failed): later writes are dropped.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// A write failed for another reason than a closed pipe (a full disk, say).
static FAILED: AtomicBool = AtomicBool::new(false);

/// Writes `bytes` to stdout; `false` once stdout is gone. A closed pipe is not an error:
/// it ends the output quietly. Any other failure is said once on stderr and turns the
/// exit code into [`crate::exit::STATE`] (see [`finish`]).
pub(crate) fn write(bytes: &[u8]) -> bool {
    if CLOSED.load(Ordering::Relaxed) {
        return false;
    }
    let mut out = io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => true,
        Err(e) => {
            CLOSED.store(true, Ordering::Relaxed);
            if e.kind() != io::ErrorKind::BrokenPipe {
                FAILED.store(true, Ordering::Relaxed);
                let _ = writeln!(io::stderr(), "error: cannot write to stdout: {e}");
            }
            false
        }
    }
}

/// Writes one formatted line to stdout (what [`outln!`] expands to).
pub(crate) fn line(args: std::fmt::Arguments<'_>) -> bool {
    let mut s = args.to_string();
    s.push('\n');
    write(s.as_bytes())
}

/// `println!` for data: quiet when stdout's reader has gone.
macro_rules! outln {
    () => {{
        $crate::out::write(b"\n");
    }};
    ($($arg:tt)*) => {{
        $crate::out::line(format_args!($($arg)*));
    }};
}
pub(crate) use outln;

/// Whether stdout's reader has gone: a write found it closed, or (on Unix) the pipe
/// reports an error without a write — so `log --follow | head -1` ends with `head`,
/// not at the next log line.
pub(crate) fn closed() -> bool {
    if CLOSED.load(Ordering::Relaxed) {
        return true;
    }
    #[cfg(unix)]
    {
        let mut fds = libc::pollfd {
            fd: libc::STDOUT_FILENO,
            events: 0,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a zero timeout; poll only reads the descriptor's state.
        let n = unsafe { libc::poll(&mut fds, 1, 0) };
        // A pipe whose read end is closed reports POLLERR on its write end.
        if n > 0 && fds.revents & libc::POLLERR != 0 {
            CLOSED.store(true, Ordering::Relaxed);
            return true;
        }
    }
    false
}

/// The exit code to end with: `code`, unless writing stdout failed for another reason
/// than a closed pipe (then [`crate::exit::STATE`], as `cat > /dev/full` fails).
pub(crate) fn finish(code: i32) -> i32 {
    if FAILED.load(Ordering::Relaxed) && code == crate::exit::OK {
        crate::exit::STATE
    } else {
        code
    }
}

/// A safety net for `println!`s not yet written through [`write`]: std panics when a
/// print fails. A closed pipe then ends the program quietly with 141 (128 + SIGPIPE,
/// what a shell reports for `git log | head`); another failure (a full disk) says so
/// and exits [`crate::exit::STATE`] — never 101 and a backtrace.
pub(crate) fn install_pipe_net() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(why) = msg.strip_prefix("failed printing to std") {
            if is_broken_pipe_text(why) {
                std::process::exit(128 + 13);
            }
            if why.starts_with("out") {
                let why = why.trim_start_matches("out:").trim();
                let _ = writeln!(io::stderr(), "error: cannot write to stdout: {why}");
                std::process::exit(crate::exit::STATE);
            }
        }
        default(info);
    }));
}

fn is_broken_pipe_text(msg: &str) -> bool {
    // std formats the io::Error: "Broken pipe (os error 32)" on Unix; Windows says
    // "The pipe is being closed. (os error 232)".
    msg.contains("Broken pipe") || msg.contains("os error 232")
}

/// Whether a terminal could act on `c`, or `c` could change how a line reads: control
/// characters (C0, DEL and C1 — U+009B is CSI, U+0085 NEL), line and paragraph separators
/// (U+2028/2029 split a line for many readers), bidi controls (U+202A–202E, U+2066–2069,
/// LRM/RLM/ALM reorder text), and invisible format characters (zero-width space, word
/// joiners, BOM, tags, fillers) that hide what a human reads. ZWNJ/ZWJ (U+200C/D) pass:
/// scripts and emoji need them and they reorder nothing.
pub(crate) fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{061C}'
                | '\u{00AD}'
                | '\u{034F}'
                | '\u{115F}'
                | '\u{1160}'
                | '\u{17B4}'
                | '\u{17B5}'
                | '\u{180B}'..='\u{180F}'
                | '\u{200B}'
                | '\u{2060}'..='\u{2064}'
                | '\u{206A}'..='\u{206F}'
                | '\u{3164}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{1BCA0}'..='\u{1BCA3}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0000}'..='\u{E007F}'
        )
}

/// Text for one terminal cell or line (a task title, a halt reason): every character
/// [`is_unsafe`] flags, line breaks and tabs included, is shown as `\u{…}`.
pub(crate) fn printable(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// [`printable`] for multi-line text (the log): `\n` and `\t` pass.
pub(crate) fn printable_text(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

/// The one escaping function for terminal output.
fn escape(s: &str, keep_lines: bool) -> Cow<'_, str> {
    let bad = |c: char| is_unsafe(c) && !(keep_lines && (c == '\n' || c == '\t'));
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if bad(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Bytes of unknown origin (a log an agent could append to) made safe for a terminal, a
/// chunk at a time: valid UTF-8 as [`printable_text`], invalid bytes as `\xNN`. A
/// sequence split across chunks is carried to the next one, so a C1 control (`C2 9B`)
/// never slips through a chunk boundary.
#[derive(Default)]
pub(crate) struct ByteEscaper {
    carry: Vec<u8>,
}

impl ByteEscaper {
    /// Escapes `chunk` into `out`, keeping an incomplete trailing sequence back.
    pub(crate) fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(chunk);
        let mut rest = &buf[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.extend_from_slice(printable_text(s).as_bytes());
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` is valid UTF-8 by from_utf8's own account.
                    out.extend_from_slice(
                        printable_text(std::str::from_utf8(good).unwrap_or_default()).as_bytes(),
                    );
                    match e.error_len() {
                        Some(n) => {
                            for b in &bad[..n] {
                                out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
                            }
                            rest = &bad[n..];
                        }
                        None => {
                            // Incomplete at the end: maybe the next chunk completes it.
                            self.carry = bad.to_vec();
                            break;
                        }
                    }
                }
            }
        }
    }

    /// The end of the input: a sequence left incomplete is shown as bytes.
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        for b in std::mem::take(&mut self.carry) {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        }
    }
}

/// `v` as JSON (pretty or one line) with every character [`is_unsafe`] flags written
/// as a `\uXXXX` escape. The same JSON value, safe to print on a terminal: serde_json
/// leaves DEL, C1 controls, U+2028/2029 and bidi controls raw inside strings.
pub(crate) fn json(v: &impl serde::Serialize, pretty: bool) -> String {
    let text = if pretty {
        serde_json::to_string_pretty(v)
    } else {
        serde_json::to_string(v)
    }
    .unwrap_or_else(|e| format!("{{\"error\":\"cannot serialise: {e}\"}}"));
    // Outside strings serde_json writes only ASCII punctuation, digits, letters and (when
    // pretty) newlines and spaces; inside them it already escapes `\n`. So a raw `\n` is
    // structure and every other flagged character sits in a string, where `\uXXXX` is valid.
    // Printable ASCII (nearly every document) is checked a byte at a time.
    let plain = |b: &u8| (0x20..0x7f).contains(b) || *b == b'\n';
    if text.as_bytes().iter().all(plain) || !text.chars().any(|c| is_unsafe(c) && c != '\n') {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unsafe(c) && c != '\n' {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_what_splits_or_reorders_a_line() {
        assert_eq!(printable("ok"), "ok");
        assert_eq!(printable("a\u{2028}b"), "a\\u{2028}b");
        assert_eq!(printable("a\u{202e}b\u{2066}"), "a\\u{202e}b\\u{2066}");
        assert_eq!(
            printable("\u{1b}[2J\u{9b}\u{85}"),
            "\\u{1b}[2J\\u{9b}\\u{85}"
        );
        assert_eq!(printable("zero\u{200b}width"), "zero\\u{200b}width");
        assert_eq!(printable("a\nb\tc"), "a\\u{a}b\\u{9}c");
        assert_eq!(printable_text("a\nb\tc\r"), "a\nb\tc\\u{d}");
        // Text people write passes: accents, CJK, emoji sequences with ZWJ.
        let fine = "café 日本 👩\u{200d}💻";
        assert_eq!(printable(fine), fine);
    }

    #[test]
    fn bytes_escape_c1_controls_split_across_chunks() {
        let mut e = ByteEscaper::default();
        let mut out = Vec::new();
        // U+009B (CSI) is C2 9B in UTF-8; split it between two chunks.
        e.push(b"a\xc2", &mut out);
        e.push(b"\x9b31m\xff\n\xe2\x80", &mut out);
        e.finish(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "a\\u{9b}31m\\xff\n\\xe2\\x80"
        );
    }

    #[test]
    fn json_escapes_inside_strings_only() {
        let v = serde_json::json!({"t": "a\u{2028}b\u{9b}\u{e0041}", "n": [1, 2]});
        let s = json(&v, true);
        assert!(s.contains("a\\u2028b\\u009b\\udb40\\udc41"), "{s}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&s).unwrap(), v);
        assert_eq!(json(&serde_json::json!({"a": 1}), false), "{\"a\":1}");
    }
}
