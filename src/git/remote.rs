//! The git a loop whose state lives in its repository needs (DESIGN §16): fetching its refs,
//! compare-and-swap pushes (`--force-with-lease`, `--atomic`), and the state ref's commits
//! written and read with plumbing. Every command that talks to the remote gets the
//! credential through its own environment only ([`Auth`]): never an argument, a file or
//! `.git/config`, and never a process an agent could be running beside.

use std::ffi::OsString;
use std::path::Path;

use super::repo::Repo;
use super::{GitError, trim_newline};

/// How loopflow's own git processes authenticate to the remote.
#[derive(Clone)]
pub(crate) enum Auth {
    /// `LOOPFLOW_GIT_TOKEN` (or the file `LOOPFLOW_GIT_TOKEN_FILE` names): sent as an HTTP
    /// `Authorization` header set in the environment of the git process that needs it.
    Token(String),
    /// The user's own git setup: credential helpers, ssh keys, `~/.netrc`.
    User,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself, whatever prints this.
        match self {
            Auth::Token(_) => f.write_str("Auth::Token(…)"),
            Auth::User => f.write_str("Auth::User"),
        }
    }
}

/// The variable that carries the token, and the one that names a file holding it (a
/// Kubernetes Secret mounted where no tick's process can read it).
pub(crate) const TOKEN_VAR: &str = "LOOPFLOW_GIT_TOKEN";
pub(crate) const TOKEN_FILE_VAR: &str = "LOOPFLOW_GIT_TOKEN_FILE";

impl Auth {
    /// From loopflow's environment: the token, the token file, else the user's setup.
    pub(crate) fn from_env() -> Result<Auth, GitError> {
        if let Some(t) = std::env::var_os(TOKEN_VAR).filter(|t| !t.is_empty()) {
            return token(t.to_string_lossy().trim());
        }
        if let Some(f) = std::env::var_os(TOKEN_FILE_VAR).filter(|t| !t.is_empty()) {
            let text = std::fs::read_to_string(&f).map_err(|e| GitError::Failed {
                what: "credential".into(),
                stderr: format!("{TOKEN_FILE_VAR}={}: {e}", Path::new(&f).display()),
            })?;
            return token(text.trim());
        }
        Ok(Auth::User)
    }

    /// What one remote git process gets in its environment: the header, no credential
    /// helper and no prompt with a token; the user's own helpers (but no prompt: a
    /// scheduler has no one to answer it) without.
    fn env(&self) -> Vec<(OsString, OsString)> {
        let mut env = vec![("GIT_TERMINAL_PROMPT".into(), "0".into())];
        if let Auth::Token(t) = self {
            let header = format!(
                "Authorization: Basic {}",
                base64(format!("x-access-token:{t}").as_bytes())
            );
            for (k, v) in [
                ("GIT_CONFIG_COUNT", "2"),
                ("GIT_CONFIG_KEY_0", "http.extraHeader"),
                ("GIT_CONFIG_VALUE_0", header.as_str()),
                // An empty helper list: the token is the only credential this process has.
                ("GIT_CONFIG_KEY_1", "credential.helper"),
                ("GIT_CONFIG_VALUE_1", ""),
            ] {
                env.push((k.into(), v.into()));
            }
        }
        env
    }
}

fn token(t: &str) -> Result<Auth, GitError> {
    // A header value cannot hold a line break: a token with one would add headers.
    if t.is_empty() || t.chars().any(|c| c.is_control()) {
        return Err(GitError::Failed {
            what: "credential".into(),
            stderr: format!("{TOKEN_VAR} is empty or holds a control character"),
        });
    }
    Ok(Auth::Token(t.to_string()))
}

/// Standard base64 with padding (the `Authorization: Basic` encoding).
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One remote of one repository, as loopflow's git talks to it.
pub(crate) struct Remote<'a> {
    /// Any directory of the local repository (the project).
    pub repo: &'a Path,
    /// The remote's name (`origin`) or URL.
    pub name: &'a str,
    pub auth: &'a Auth,
}

/// Why a fetch did not bring the refs asked for.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// A ref asked for by its exact name is not on the remote.
    #[error("a ref is missing on the remote")]
    Missing,
    #[error(transparent)]
    Git(#[from] GitError),
}

/// What a ref on the remote must be for a push to go through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expect {
    /// It must not exist.
    Absent,
    /// It must point at this commit.
    At(String),
}

/// One ref a push sets: `dst` on the remote to the local object `src`, if it is `expect`.
#[derive(Debug, Clone)]
pub(crate) struct Update {
    pub src: String,
    pub dst: String,
    pub expect: Expect,
}

/// How a push ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// The remote took every update.
    Accepted,
    /// The remote refused (a ref was not what was expected): nothing changed there.
    Rejected(String),
    /// Nobody knows: the connection failed or the answer was lost. Fetch and look.
    Unknown(String),
}

/// Settings every command that talks to the remote gets: a transfer that stalls for a
/// minute fails instead of holding a tick (and its lease) forever.
const NET: &[&str] = &["http.lowSpeedLimit=1", "http.lowSpeedTime=60"];

/// The user's repository `dir` is in, named explicitly for every command.
fn repo_of(dir: &Path) -> Result<Repo, GitError> {
    Repo::checkout(dir)?.ok_or_else(|| GitError::Failed {
        what: "rev-parse".into(),
        stderr: format!("{} is not in a git repository", dir.display()),
    })
}

impl Remote<'_> {
    /// A command to the remote: the user's credential helpers allowed when the user's
    /// own setup is the credential, the token in this process's environment when it is.
    fn run(&self, args: &[&str]) -> Result<std::process::Output, GitError> {
        let mut g = repo_of(self.repo)?.git().configs(NET);
        if matches!(self.auth, Auth::User) {
            g = g.with_credentials();
        }
        for (k, v) in self.auth.env() {
            g = g.env(k, v);
        }
        g.args(args).output()
    }

    /// Fetches each `(remote ref, local ref)` pair, forced (the local refs are only a copy
    /// of the remote's). [`FetchError::Missing`] when a remote ref does not exist.
    pub(crate) fn fetch(&self, pairs: &[(&str, &str)]) -> Result<(), FetchError> {
        let specs: Vec<String> = pairs.iter().map(|(s, d)| format!("+{s}:{d}")).collect();
        let mut args = vec![
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-recurse-submodules",
            self.name,
        ];
        args.extend(specs.iter().map(String::as_str));
        let out = self.run(&args)?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("couldn't find remote ref") {
            return Err(FetchError::Missing);
        }
        Err(FetchError::Git(GitError::Failed {
            what: "fetch".into(),
            stderr: stderr.trim().to_string(),
        }))
    }

    /// Which of `refs` exist on the remote: `(name, object)` for each that does.
    pub(crate) fn list(&self, refs: &[&str]) -> Result<Vec<(String, String)>, GitError> {
        let mut args = vec!["ls-remote", "--refs", self.name];
        args.extend(refs.iter().copied());
        let out = super::ok(self.run(&args)?, "ls-remote")?;
        Ok(String::from_utf8_lossy(&out)
            .lines()
            .filter_map(|l| {
                let (oid, name) = l.split_once('\t')?;
                Some((name.to_string(), oid.to_string()))
            })
            .collect())
    }

    /// Pushes `updates` with a compare-and-swap on each (`--force-with-lease`), all or
    /// none (`--atomic`) when there are several: the remote's own ref transaction decides
    /// every race.
    pub(crate) fn push(&self, updates: &[Update]) -> Result<Pushed, GitError> {
        let leases: Vec<String> = updates
            .iter()
            .map(|u| match &u.expect {
                Expect::Absent => format!("--force-with-lease={}:", u.dst),
                Expect::At(o) => format!("--force-with-lease={}:{o}", u.dst),
            })
            .collect();
        let specs: Vec<String> = updates
            .iter()
            .map(|u| format!("{}:{}", u.src, u.dst))
            .collect();
        let mut args = vec![
            "push",
            "--porcelain",
            "--no-verify",
            "--recurse-submodules=no",
        ];
        if updates.len() > 1 {
            args.push("--atomic");
        }
        args.extend(leases.iter().map(String::as_str));
        args.push(self.name);
        args.extend(specs.iter().map(String::as_str));
        let out = self.run(&args)?;
        Ok(push_result(&out.stdout, &out.stderr, out.status.success()))
    }
}

/// Reads `push --porcelain`: one `<flag>\t<from>:<to>\t<summary>` line per ref. A push
/// with no such lines never reached the point where the remote decides.
fn push_result(stdout: &[u8], stderr: &[u8], success: bool) -> Pushed {
    let text = String::from_utf8_lossy(stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.len() > 2 && l.as_bytes()[1] == b'\t')
        .collect();
    let err = String::from_utf8_lossy(stderr).trim().to_string();
    if lines.is_empty() {
        return Pushed::Unknown(err);
    }
    let refused: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with('!'))
        .collect();
    if refused.is_empty() && success {
        return Pushed::Accepted;
    }
    if refused.is_empty() {
        return Pushed::Unknown(err);
    }
    Pushed::Rejected(
        refused
            .iter()
            .map(|l| l.splitn(3, '\t').nth(2).unwrap_or(l).to_string())
            .collect::<Vec<_>>()
            .join("; "),
    )
}

/// Writes a commit of a flat tree holding `files` (name, bytes), on `parent`, by loopflow;
/// its id. Nothing but objects is written: no ref moves.
pub(crate) fn write_commit(
    repo: &Path,
    files: &[(&str, &[u8])],
    parent: Option<&str>,
    message: &str,
) -> Result<String, GitError> {
    let r = repo_of(repo)?;
    let mut tree = Vec::new();
    for (name, bytes) in files {
        let oid = r
            .git()
            .args(["hash-object", "-w", "--stdin"])
            .stdin(bytes.to_vec())
            .ok("hash-object")?;
        let oid = String::from_utf8_lossy(trim_newline(&oid)).into_owned();
        tree.extend_from_slice(format!("100644 blob {oid}\t{name}\n").as_bytes());
    }
    let tree = r.git().arg("mktree").stdin(tree).ok("mktree")?;
    let tree = String::from_utf8_lossy(trim_newline(&tree)).into_owned();
    let mut g = r
        .git()
        .configs(["user.name=loopflow", "user.email=loopflow@localhost"])
        .args(["commit-tree", &tree, "-m", message]);
    if let Some(p) = parent {
        g = g.args(["-p", p]);
    }
    let out = g.ok("commit-tree")?;
    Ok(String::from_utf8_lossy(trim_newline(&out)).into_owned())
}

/// The bytes of each of `names` in `commit`'s tree (`None`: not there), read by one
/// `cat-file --batch`.
pub(crate) fn read_files(
    repo: &Path,
    commit: &str,
    names: &[&str],
) -> Result<Vec<Option<Vec<u8>>>, GitError> {
    let mut input = Vec::new();
    for n in names {
        input.extend_from_slice(format!("{commit}:{n}\n").as_bytes());
    }
    let raw = repo_of(repo)?
        .git()
        .args(["cat-file", "--batch"])
        .stdin(input)
        .ok("cat-file")?;
    let bad = || GitError::Unexpected {
        what: "cat-file --batch".into(),
        output: String::from_utf8_lossy(&raw[..raw.len().min(200)]).into_owned(),
    };
    let mut rest = &raw[..];
    let mut files = Vec::with_capacity(names.len());
    for _ in names {
        let nl = rest.iter().position(|b| *b == b'\n').ok_or_else(bad)?;
        let header = std::str::from_utf8(&rest[..nl]).map_err(|_| bad())?;
        rest = &rest[nl + 1..];
        if header.ends_with(" missing") {
            files.push(None);
            continue;
        }
        let size: usize = header
            .rsplit(' ')
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)?;
        if rest.len() < size + 1 {
            return Err(bad());
        }
        files.push(Some(rest[..size].to_vec()));
        rest = &rest[size + 1..];
    }
    Ok(files)
}

/// Points the local ref `name` at `oid` (`update-ref`, no compare: a local copy).
pub(crate) fn set_ref(repo: &Path, name: &str, oid: &str) -> Result<(), GitError> {
    repo_of(repo)?
        .git()
        .args(["update-ref", "-m", "loopflow fetch", name, oid])
        .ok("update-ref")
        .map(|_| ())
}

/// Removes the local ref `name` if it is there.
pub(crate) fn delete_ref(repo: &Path, name: &str) -> Result<(), GitError> {
    repo_of(repo)?
        .git()
        .args(["update-ref", "-d", name])
        .ok("update-ref -d")
        .map(|_| ())
}

/// The URL of remote `name` as the repository configures it, `None` when it has none.
pub(crate) fn url(repo: &Path, name: &str) -> Option<String> {
    let out = repo_of(repo)
        .ok()?
        .git()
        .args(["remote", "get-url", "--", name])
        .ok("remote get-url")
        .ok()?;
    let url = String::from_utf8_lossy(trim_newline(&out)).into_owned();
    (!url.is_empty()).then_some(url)
}

/// The commit `HEAD` names in `repo`, `None` when unborn.
pub(crate) fn head(repo: &Path) -> Option<String> {
    repo_of(repo).ok()?.rev("HEAD").ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_encoding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"x-access-token:abc"), "eC1hY2Nlc3MtdG9rZW46YWJj");
    }

    #[test]
    fn push_porcelain_says_accepted_rejected_or_unknown() {
        let ok = b"To file:///r\n*\tabc:refs/loopflow/l/state\t[new reference]\nDone\n";
        assert_eq!(push_result(ok, b"", true), Pushed::Accepted);
        let stale = b"To file:///r\n!\tabc:refs/loopflow/l/state\t[rejected] (stale info)\nDone\n";
        assert!(
            matches!(push_result(stale, b"", false), Pushed::Rejected(r) if r.contains("stale"))
        );
        let lost = b"";
        assert!(matches!(
            push_result(lost, b"fatal: the remote end hung up", false),
            Pushed::Unknown(e) if e.contains("hung up")
        ));
    }

    #[test]
    fn the_token_is_never_shown_and_never_holds_a_line_break() {
        let a = token("s3cret").unwrap();
        assert!(!format!("{a:?}").contains("s3cret"));
        assert!(token("a\nInjected: x").is_err());
        let env = a.env();
        assert!(env.iter().any(|(k, v)| k == "GIT_CONFIG_VALUE_0"
            && v.to_string_lossy()
                == format!("Authorization: Basic {}", base64(b"x-access-token:s3cret"))));
    }
}
