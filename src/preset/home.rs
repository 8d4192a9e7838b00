//! An agent CLI's state of its own (nothing planted for later): a preset's `[state]` names
//! the variables that move its CLI's config and state directories (`CLAUDE_CONFIG_DIR`,
//! `CODEX_HOME`, `GEMINI_CLI_HOME`, the `XDG_*_HOME` of OpenCode and goose) and each tick
//! points them at directories of the loop's own, under
//! `$XDG_STATE_HOME/loopflow/agents/<project>-<hash>/<loop>/<preset>/`, seeded from the
//! user's login and settings. The agent may write there and nowhere in the user's own
//! CLI state, so a hook, plugin or MCP server it plants is never loaded by the user's CLI.
//!
//! Seeds: a settings file is copied afresh every tick (the agent's edits to its copy do not
//! outlive the tick); a login file (`login = true`) is copied when the user's changes, so a
//! token the CLI refreshed in its copy is kept until the user logs in again. Copies, not
//! links: a link would hand the agent the user's own file to rewrite (or, read-only, break
//! the CLI's token refresh). Every write goes through directory descriptors opened without
//! following links, so a link the agent planted in its directory never redirects one.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::toml_read::Table;

/// A preset's `[state]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StateSpec {
    /// Variable → directory (relative to the loop's state root) set for the agent.
    pub dirs: Vec<(String, String)>,
    pub seeds: Vec<Seed>,
}

/// One file (or directory) put into the loop's state before the agent runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seed {
    /// Where, relative to the root; a trailing `/` makes a directory.
    pub to: String,
    /// The user's file: the first candidate that resolves (`$VAR/…` when VAR is set,
    /// `~/…`, or absolute) is the one the user's own CLI reads.
    pub from: Vec<String>,
    /// Only these top-level keys of a JSON, JSONC or TOML file.
    pub keys: Option<Vec<String>>,
    /// JSON merged over what is copied (written even when the user has no such file).
    pub set: Option<Value>,
    /// Fixed content instead of a copy.
    pub text: Option<String>,
    /// A login: copied only when the user's changed since the last copy.
    pub login: bool,
}

impl StateSpec {
    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty() && self.seeds.is_empty()
    }

    /// The seeds that carry a login (for `doctor` and the credential key).
    pub fn logins(&self) -> impl Iterator<Item = &Seed> {
        self.seeds.iter().filter(|s| s.login)
    }

    /// Reads a preset's `[state]` table.
    pub fn read(t: &Table<'_, '_>, diags: &mut Diagnostics) -> StateSpec {
        t.deny_unknown(&["dirs", "seed"], diags);
        let mut spec = StateSpec::default();
        let bad = |span: std::ops::Range<usize>, what: &str, diags: &mut Diagnostics| {
            diags.push(
                Diagnostic::error(Code::InvalidValue, t.source, span, what.to_string())
                    .label("not a relative path inside the loop's state")
                    .help("write a relative path without `..`, such as \"claude\""),
            );
        };
        if let Some(d) = t.table("dirs", diags) {
            for (k, v) in d.scalars(diags) {
                match v.as_str() {
                    Some(rel) if relative_ok(rel.trim_end_matches('/')) => {
                        spec.dirs
                            .push((k.value, rel.trim_end_matches('/').to_string()));
                    }
                    _ => bad(
                        k.span,
                        &format!("`state.dirs.{}` is not a usable directory", k.value),
                        diags,
                    ),
                }
            }
        }
        if let Some(seeds) = t.table("seed", diags) {
            for (to, st) in seeds.subtables(diags) {
                st.deny_unknown(&["from", "keys", "set", "text", "login"], diags);
                if !relative_ok(to.value.trim_end_matches('/')) {
                    bad(
                        to.span.clone(),
                        &format!("`state.seed.{}` is not a usable path", to.value),
                        diags,
                    );
                    continue;
                }
                let list = |key: &str, diags: &mut Diagnostics| {
                    st.str_list(key, diags)
                        .map(|(v, _)| v.into_iter().map(|s| s.value).collect::<Vec<_>>())
                };
                let set = st.str("set", diags).and_then(|s| {
                    match serde_json::from_str::<Value>(&s.value) {
                        Ok(v @ Value::Object(_)) => Some(v),
                        _ => {
                            diags.push(
                                Diagnostic::error(Code::InvalidValue, t.source, s.span, "`set` is not a JSON object")
                                    .label("not a JSON object")
                                    .help("write the keys to merge as a JSON object, e.g. '{\"privacy\": {\"usageStatisticsEnabled\": false}}'"),
                            );
                            None
                        }
                    }
                });
                spec.seeds.push(Seed {
                    to: to.value,
                    from: list("from", diags).unwrap_or_default(),
                    keys: list("keys", diags),
                    set,
                    text: st.str("text", diags).map(|s| s.value),
                    login: st.bool("login", diags).unwrap_or(false),
                });
            }
        }
        spec
    }
}

/// A path that stays inside the root: relative, no `..`, not empty.
fn relative_ok(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Why the agent's own state could not be made ready (the node then fails: an agent
/// pointed at the user's state instead would be a way out).
#[derive(Debug, thiserror::Error)]
pub(crate) enum HomeError {
    #[error(
        "neither XDG_STATE_HOME nor HOME is set: there is nowhere to keep the agent's own state"
    )]
    NoHome,
    #[error("the agent's own state {}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// Where a loop's agent of `preset` keeps its state.
pub(crate) fn root(project: &Path, loop_name: &str, preset: &str) -> Result<PathBuf, HomeError> {
    Ok(crate::state::machine::base()
        .ok_or(HomeError::NoHome)?
        .join("agents")
        .join(crate::state::machine::project_key(project))
        .join(loop_name)
        .join(preset))
}

/// The agent's state, ready: what to set in its environment, what it may write, and
/// what could not be seeded (said as a WARN; the run goes on).
#[derive(Debug, Default)]
pub(crate) struct Home {
    pub env: Vec<(String, String)>,
    pub write: Vec<PathBuf>,
    pub notes: Vec<String>,
}

/// The user's file a seed copies, when one of its candidates resolves.
pub(crate) fn source(seed: &Seed) -> Option<PathBuf> {
    seed.from.iter().find_map(|c| expand(c))
}

/// `$VAR/rest` (VAR set to an absolute path), `~/rest`, or an absolute path.
fn expand(c: &str) -> Option<PathBuf> {
    if let Some(rest) = c.strip_prefix('$') {
        let (var, tail) = rest.split_once('/').unwrap_or((rest, ""));
        let base = std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())?;
        return Some(if tail.is_empty() {
            base
        } else {
            base.join(tail)
        });
    }
    if let Some(rest) = c.strip_prefix("~/") {
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
        return Some(PathBuf::from(home).join(rest));
    }
    Path::new(c).is_absolute().then(|| PathBuf::from(c))
}

/// Reads the user's file (following links: it is the user's own), at most 16 MiB.
fn read_user(p: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(p).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut out = Vec::new();
    f.take(crate::fs_safe::TEXT_MAX)
        .read_to_end(&mut out)
        .ok()?;
    Some(out)
}

/// What a seed writes, or `None` when there is nothing to write (the user has no such
/// file). An error is a file that could not be read as its format.
fn content(seed: &Seed) -> Result<Option<Vec<u8>>, String> {
    if let Some(t) = &seed.text {
        return Ok(Some(t.as_bytes().to_vec()));
    }
    let src = source(seed);
    let bytes = src.as_deref().and_then(read_user);
    if seed.keys.is_none() && seed.set.is_none() {
        return Ok(bytes);
    }
    let toml = seed.to.ends_with(".toml");
    let Some(bytes) = bytes else {
        // No user file: only what `set` says.
        return Ok(seed.set.as_ref().map(|s| pretty(s.clone())));
    };
    let text = String::from_utf8_lossy(&bytes);
    let shown = src
        .as_deref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    if toml {
        let mut table: toml::Table =
            toml::from_str(&text).map_err(|e| format!("{shown}: not TOML ({})", e.message()))?;
        if let Some(keys) = &seed.keys {
            table.retain(|k, _| keys.iter().any(|x| x == k));
        }
        return toml::to_string(&table)
            .map(|s| Some(s.into_bytes()))
            .map_err(|e| format!("{shown}: {e}"));
    }
    let mut v: Value = serde_json::from_str(&strip_jsonc(&text))
        .map_err(|e| format!("{shown}: not JSON ({e})"))?;
    if let (Some(keys), Value::Object(m)) = (&seed.keys, &mut v) {
        m.retain(|k, _| keys.iter().any(|x| x == k));
    }
    if let Some(set) = &seed.set {
        merge(&mut v, set);
    }
    Ok(Some(pretty(v)))
}

fn pretty(v: Value) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// `over`'s keys into `base`, objects merged key by key.
fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// JSON with comments (`//`, `/* */`) and trailing commas, as OpenCode's `.jsonc`, made
/// plain JSON.
pub(crate) fn strip_jsonc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            out.push(c);
            match c {
                '\\' => out.extend(chars.next()),
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_str = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for n in chars.by_ref() {
                    if last == '*' && n == '/' {
                        break;
                    }
                    last = n;
                }
            }
            _ => out.push(c),
        }
    }
    // Trailing commas: a comma whose next non-space character closes.
    let mut clean = String::with_capacity(out.len());
    let bytes: Vec<char> = out.chars().collect();
    let mut in_str = false;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if in_str {
            clean.push(c);
            if c == '\\' {
                if let Some(n) = bytes.get(i + 1) {
                    clean.push(*n);
                }
                i += 1;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
            clean.push(c);
        } else if c == ',' {
            let next = bytes[i + 1..].iter().find(|c| !c.is_whitespace());
            if !matches!(next, Some('}') | Some(']')) {
                clean.push(c);
            }
        } else {
            clean.push(c);
        }
        i += 1;
    }
    clean
}

/// Makes the agent's state ready under `root`: its directories (mode 700), then every
/// seed. Directories and files the agent replaced with links are replaced, never followed.
pub(crate) fn prepare(spec: &StateSpec, root: &Path) -> Result<Home, HomeError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| HomeError::Io { path, error }
    };
    create_private_dir(root).map_err(io(root))?;
    let mut home = Home::default();
    for (var, rel) in &spec.dirs {
        let dir = root.join(rel);
        at::ensure_dir(root, rel).map_err(io(&dir))?;
        home.env.push((var.clone(), dir.display().to_string()));
        home.write.push(dir);
    }
    let record_path = root.join(".seeds.json");
    let mut record: serde_json::Map<String, Value> = crate::fs_safe::read_to_string(&record_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let before = record.clone();
    for seed in &spec.seeds {
        let dest = root.join(&seed.to);
        if seed.to.ends_with('/') {
            at::ensure_dir(root, seed.to.trim_end_matches('/')).map_err(io(&dest))?;
            continue;
        }
        let bytes = match content(seed) {
            Ok(b) => b,
            Err(why) => {
                home.notes.push(format!("not seeded: {why}"));
                None
            }
        };
        let Some(bytes) = bytes else {
            at::remove(root, &seed.to).map_err(io(&dest))?;
            record.remove(&seed.to);
            continue;
        };
        let digest = blake3::hash(&bytes).to_hex().to_string();
        if seed.login
            && record.get(&seed.to).and_then(Value::as_str) == Some(digest.as_str())
            && at::is_file(root, &seed.to)
        {
            // The user's login is what was copied last: the CLI's copy (a refreshed
            // token, maybe) stays.
            continue;
        }
        at::write(root, &seed.to, &bytes).map_err(io(&dest))?;
        record.insert(seed.to.clone(), Value::String(digest));
    }
    if record != before {
        let json = serde_json::to_vec(&record).unwrap_or_default();
        crate::fs_safe::write_atomic(root, &record_path, &json).map_err(io(&record_path))?;
    }
    Ok(home)
}

/// `dir` and its parents, the new ones private to the user.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir)
}

/// Writes below a root through directory descriptors, following no link: what the agent
/// planted in its own directory (a link to the user's `~/.bashrc`, a directory swapped
/// for a link to `~/.claude`) is removed, never written through.
#[cfg(unix)]
mod at {
    use std::ffi::CString;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn cstr(s: &str) -> io::Result<CString> {
        CString::new(s).map_err(|_| io::Error::other("a NUL in a path"))
    }

    fn open_root(root: &Path) -> io::Result<OwnedFd> {
        let p = CString::new(root.as_os_str().as_bytes())
            .map_err(|_| io::Error::other("a NUL in a path"))?;
        // SAFETY: a plain open of a NUL-terminated path; the fd is owned below.
        let fd = unsafe {
            libc::open(
                p.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The directory `name` in `parent`, made (mode 700) if missing; anything else there
    /// (a link, a file) is removed first.
    fn dir_at(parent: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
        let c = cstr(name)?;
        for attempt in 0..2 {
            // SAFETY: mkdirat/openat/unlinkat on a valid dirfd and a NUL-terminated name.
            unsafe {
                libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o700);
                let fd = libc::openat(
                    parent.as_raw_fd(),
                    c.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                );
                if fd >= 0 {
                    return Ok(OwnedFd::from_raw_fd(fd));
                }
                let e = io::Error::last_os_error();
                let replaced = matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR));
                if !replaced || attempt == 1 {
                    return Err(e);
                }
                libc::unlinkat(parent.as_raw_fd(), c.as_ptr(), 0);
            }
        }
        Err(io::Error::other("unreachable"))
    }

    /// The directory holding `rel`'s last component, and that component.
    fn parent_of<'a>(root: &Path, rel: &'a str) -> io::Result<(OwnedFd, &'a str)> {
        let mut dir = open_root(root)?;
        let mut parts: Vec<&str> = rel.split('/').filter(|s| !s.is_empty()).collect();
        let last = parts
            .pop()
            .ok_or_else(|| io::Error::other("an empty path"))?;
        for p in parts {
            dir = dir_at(&dir, p)?;
        }
        Ok((dir, last))
    }

    pub(super) fn ensure_dir(root: &Path, rel: &str) -> io::Result<()> {
        let (dir, last) = parent_of(root, rel)?;
        dir_at(&dir, last).map(drop)
    }

    fn unlink(dir: &OwnedFd, c: &CString) -> io::Result<()> {
        // SAFETY: unlinkat on a valid dirfd and a NUL-terminated name.
        let r = unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(()),
            // A directory in a file's place: removed if empty, else an error.
            Some(libc::EISDIR | libc::EPERM) => {
                // SAFETY: as above.
                let r = unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) };
                if r == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            }
            _ => Err(e),
        }
    }

    pub(super) fn write(root: &Path, rel: &str, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        let (dir, last) = parent_of(root, rel)?;
        let c = cstr(last)?;
        unlink(&dir, &c)?;
        // SAFETY: openat on a valid dirfd; O_EXCL|O_NOFOLLOW never opens what is there.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        f.write_all(bytes)
    }

    pub(super) fn remove(root: &Path, rel: &str) -> io::Result<()> {
        match parent_of(root, rel) {
            Ok((dir, last)) => unlink(&dir, &cstr(last)?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub(super) fn is_file(root: &Path, rel: &str) -> bool {
        let Ok((dir, last)) = parent_of(root, rel) else {
            return false;
        };
        let Ok(c) = cstr(last) else { return false };
        // SAFETY: fstatat into a zeroed stat buffer, not following links.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstatat(
                dir.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            ) == 0
                && (st.st_mode & libc::S_IFMT) == libc::S_IFREG
        }
    }
}

/// Elsewhere: plain paths (no sandbox there lets an agent plant links loopflow follows).
#[cfg(not(unix))]
mod at {
    use std::io;
    use std::path::Path;

    pub fn ensure_dir(root: &Path, rel: &str) -> io::Result<()> {
        std::fs::create_dir_all(root.join(rel))
    }
    pub fn write(root: &Path, rel: &str, bytes: &[u8]) -> io::Result<()> {
        let p = root.join(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(p, bytes)
    }
    pub fn remove(root: &Path, rel: &str) -> io::Result<()> {
        match std::fs::remove_file(root.join(rel)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
    pub fn is_file(root: &Path, rel: &str) -> bool {
        root.join(rel).is_file()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(to: &str) -> Seed {
        Seed {
            to: to.into(),
            ..Default::default()
        }
    }

    #[test]
    fn jsonc_loses_comments_and_trailing_commas_but_not_strings() {
        let s = "{\n // a comment\n \"a\": \"x // not a comment\", /* b */ \"b\": [1, 2,],\n}";
        let v: Value = serde_json::from_str(&strip_jsonc(s)).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"a": "x // not a comment", "b": [1, 2]})
        );
    }

    #[test]
    fn seeds_copy_filter_merge_and_keep_a_refreshed_login() {
        let d = tempfile::tempdir().expect("tmp");
        let user = d.path().join("user");
        std::fs::create_dir_all(&user).expect("user");
        std::fs::write(
            user.join("s.json"),
            r#"{"keep": 1, "hooks": {"x": "rm -rf ~"}}"#,
        )
        .expect("w");
        std::fs::write(user.join("cred.json"), "token-1").expect("w");
        let root = d.path().join("root");
        let spec = StateSpec {
            dirs: vec![("MY_HOME".into(), "home".into())],
            seeds: vec![
                Seed {
                    from: vec![user.join("s.json").display().to_string()],
                    keys: Some(vec!["keep".into()]),
                    set: Some(serde_json::json!({"privacy": {"off": true}})),
                    ..seed("home/settings.json")
                },
                Seed {
                    from: vec![user.join("cred.json").display().to_string()],
                    login: true,
                    ..seed("home/cred.json")
                },
                Seed {
                    from: vec![user.join("missing").display().to_string()],
                    ..seed("home/gone.json")
                },
                Seed {
                    text: Some("{}".into()),
                    ..seed("home/deep/fixed.json")
                },
                seed("home/node_modules/"),
            ],
        };
        let h = prepare(&spec, &root).expect("prepare");
        assert_eq!(
            h.env,
            [(
                "MY_HOME".to_string(),
                root.join("home").display().to_string()
            )]
        );
        let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
        let v: Value = serde_json::from_str(&read("home/settings.json")).expect("json");
        assert_eq!(v, serde_json::json!({"keep": 1, "privacy": {"off": true}}));
        assert_eq!(read("home/cred.json"), "token-1");
        assert_eq!(read("home/deep/fixed.json"), "{}");
        assert!(root.join("home/node_modules").is_dir());
        // The agent refreshes its token and rewrites its settings; a planted file stays
        // its own, and the settings come back from the user's.
        std::fs::write(root.join("home/cred.json"), "token-2").expect("w");
        std::fs::write(root.join("home/settings.json"), r#"{"hooks": 1}"#).expect("w");
        std::fs::write(root.join("home/gone.json"), "planted").expect("w");
        prepare(&spec, &root).expect("again");
        assert_eq!(
            read("home/cred.json"),
            "token-2",
            "a refreshed login is kept"
        );
        assert!(!read("home/settings.json").contains("hooks"));
        assert!(
            !root.join("home/gone.json").exists(),
            "no user file: no copy"
        );
        // The user logs in again: the new login wins.
        std::fs::write(user.join("cred.json"), "token-3").expect("w");
        prepare(&spec, &root).expect("again");
        assert_eq!(read("home/cred.json"), "token-3");
    }

    #[cfg(unix)]
    #[test]
    fn planted_links_are_replaced_never_followed() {
        let d = tempfile::tempdir().expect("tmp");
        let victim = d.path().join("victim");
        std::fs::create_dir_all(&victim).expect("victim");
        std::fs::write(victim.join("bashrc"), "mine").expect("w");
        let root = d.path().join("root");
        let spec = StateSpec {
            dirs: vec![("H".into(), "home".into())],
            seeds: vec![
                Seed {
                    text: Some("seeded".into()),
                    ..seed("home/settings.json")
                },
                Seed {
                    text: Some("seeded".into()),
                    ..seed("home/sub/file.json")
                },
            ],
        };
        prepare(&spec, &root).expect("prepare");
        // The agent swaps a file for a link to the user's file and a directory for a
        // link to the user's directory.
        std::fs::remove_file(root.join("home/settings.json")).expect("rm");
        std::os::unix::fs::symlink(victim.join("bashrc"), root.join("home/settings.json"))
            .expect("ln");
        std::fs::remove_dir_all(root.join("home/sub")).expect("rm");
        std::os::unix::fs::symlink(&victim, root.join("home/sub")).expect("ln");
        prepare(&spec, &root).expect("again");
        assert_eq!(
            std::fs::read_to_string(victim.join("bashrc")).expect("r"),
            "mine"
        );
        assert!(!victim.join("file.json").exists());
        assert_eq!(
            std::fs::read_to_string(root.join("home/sub/file.json")).expect("r"),
            "seeded"
        );
        assert!(
            !std::fs::symlink_metadata(root.join("home/sub"))
                .expect("m")
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn sources_follow_the_users_variables() {
        let s = Seed {
            from: vec!["$LOOPFLOW_TEST_UNSET_VAR/x".into(), "/etc/y".into()],
            ..seed("a")
        };
        assert_eq!(source(&s), Some(PathBuf::from("/etc/y")));
        assert!(
            relative_ok("a/b") && !relative_ok("../a") && !relative_ok("/a") && !relative_ok("")
        );
    }
}
