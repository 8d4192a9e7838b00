//! Credentials a repository's git configuration holds where a tick's processes could read
//! them (DESIGN §16): an `http.*.extraheader` (what `actions/checkout` leaves unless
//! `persist-credentials: false`), or a URL with a password or token in it. Agents read
//! the repository's `.git` (git needs it), so such a file hands them the credential:
//! a tick under `[sandbox] mode = "enforce"` refuses to run, under `auto` it warns.

use std::path::{Path, PathBuf};

/// One credential found: where, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exposed {
    pub file: PathBuf,
    /// 1-based.
    pub line: usize,
    /// What it is (`http.<url>.extraheader`, `a URL with a password`), never its value.
    pub what: String,
    pub fix: String,
    /// Who can read it.
    pub reach: &'static str,
}

impl std::fmt::Display for Exposed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: {} ({}); {}",
            self.file.display(),
            self.line,
            self.what,
            self.reach,
            self.fix
        )
    }
}

/// How deep `include.path` chains are followed.
const MAX_DEPTH: usize = 5;
/// The most bytes of one config file read.
const MAX_FILE: u64 = 1 << 20;

/// The credentials in the configuration of the repository `project` is in: its common
/// `config`, every `config.worktree`, what they include, and the system's `/etc/gitconfig`
/// (agents read `/etc`). The user's global config is not readable by a tick's processes.
/// `checkout_readable` says whether the tick's processes can read the checkout's `.git`
/// (a loop without a worktree, or reads not confined): where they cannot, a credential
/// there is still named (a tick with worktrees off or without the read sandbox would
/// hand it over), as out of their reach today. Found without starting git: a tick reads
/// a few small files for it.
pub(crate) fn exposed(project: &Path, checkout_readable: bool) -> Vec<Exposed> {
    let mut out = Vec::new();
    scan(Path::new("/etc/gitconfig"), 0, &mut out);
    let from = out.len();
    // From the files alone: a tick of a project outside any repository starts no git for
    // this (a layout only git can read — another owner's, across a mount — is not looked at).
    let Some(common) = super::local::discover(project).map(|f| f.common) else {
        return out;
    };
    let config = common.join("config");
    let Ok(bytes) = crate::fs_safe::head(&config, MAX_FILE) else {
        return out;
    };
    let text = String::from_utf8_lossy(&bytes);
    scan_text(&config, &text, 0, &mut out);
    // `config.worktree` files count only where the repository turned them on.
    if text.to_ascii_lowercase().contains("worktreeconfig") {
        let mut more = vec![common.join("config.worktree")];
        if let Ok(rd) = std::fs::read_dir(common.join("worktrees")) {
            more.extend(rd.flatten().map(|e| e.path().join("config.worktree")));
        }
        for f in more {
            scan(&f, 0, &mut out);
        }
    }
    if !checkout_readable {
        for e in &mut out[from..] {
            e.reach = "out of the tick's reach in the loop's own worktree, but read by a loop with worktrees off or without the read sandbox";
        }
    }
    out
}

fn scan(file: &Path, depth: usize, out: &mut Vec<Exposed>) {
    if let Ok(bytes) = crate::fs_safe::head(file, MAX_FILE) {
        scan_text(file, &String::from_utf8_lossy(&bytes), depth, out);
    }
}

fn scan_text(file: &Path, text: &str, depth: usize, out: &mut Vec<Exposed>) {
    let mut section = String::new();
    let mut sub = String::new();
    for (i, raw) in text.lines().enumerate() {
        let mut line = raw.trim();
        if let Some(rest) = line.strip_prefix('[')
            && let Some(end) = rest.find(']')
        {
            let head = &rest[..end];
            match head.split_once(char::is_whitespace) {
                Some((s, q)) => {
                    section = s.to_ascii_lowercase();
                    sub = q.trim().trim_matches('"').to_string();
                }
                None => match head.split_once('.') {
                    // The old `[section.subsection]` form.
                    Some((s, q)) => {
                        section = s.to_ascii_lowercase();
                        sub = q.to_string();
                    }
                    None => {
                        section = head.to_ascii_lowercase();
                        sub.clear();
                    }
                },
            }
            if let Some(what) = url_credential(&sub) {
                out.push(found(
                    file,
                    i + 1,
                    format!("[{section} \"…\"] names {what}"),
                    &section,
                ));
            }
            line = rest[end + 1..].trim();
        }
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"')),
            None => (line.to_ascii_lowercase(), ""),
        };
        if section == "http" && key == "extraheader" && !value.is_empty() {
            let name = if sub.is_empty() {
                "http.extraheader".to_string()
            } else {
                format!("http.{sub}.extraheader")
            };
            out.push(found(file, i + 1, name, "http"));
        } else if let Some(what) = url_credential(value) {
            out.push(found(
                file,
                i + 1,
                format!("{section}.{key} is {what}"),
                &section,
            ));
        }
        if (section == "include" || section == "includeif") && key == "path" && depth < MAX_DEPTH {
            let p = Path::new(value);
            let p = match value.strip_prefix("~/") {
                Some(rest) => std::env::var_os("HOME")
                    .map_or(p.to_path_buf(), |h| PathBuf::from(h).join(rest)),
                None if p.is_relative() => file.parent().unwrap_or(Path::new(".")).join(p),
                None => p.to_path_buf(),
            };
            scan(&p, depth + 1, out);
        }
    }
}

fn found(file: &Path, line: usize, what: String, section: &str) -> Exposed {
    let fix = if section == "http" {
        "remove it (`git config --unset-all` that key; under GitHub Actions, give actions/checkout `persist-credentials: false`) and give loopflow the token as LOOPFLOW_GIT_TOKEN, which only its own git processes see".to_string()
    } else {
        "take the credential out of the URL (`git remote set-url <remote> <url without it>`) and give loopflow the token as LOOPFLOW_GIT_TOKEN, or use a credential helper".to_string()
    };
    Exposed {
        file: file.to_path_buf(),
        line,
        what,
        fix,
        reach: "readable by the tick's processes",
    }
}

/// `url` without any user name or password (fit to be written into a generated file):
/// `https://tok@host/r` → `https://host/r`; an scp-like `git@host:r` stays as it is.
pub(crate) fn without_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// Whether `s` is a URL carrying a credential: `scheme://user:password@host` or a user
/// name that is a token (`https://ghp_…@github.com`). Says which, never the value.
fn url_credential(s: &str) -> Option<&'static str> {
    let (_, rest) = s.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    if let Some((_, password)) = userinfo.split_once(':') {
        return (!password.is_empty()).then_some("a URL with a password");
    }
    let prefixes = [
        "ghp_",
        "gho_",
        "ghs_",
        "ghu_",
        "ghr_",
        "github_pat_",
        "glpat-",
    ];
    let tokenish = prefixes.iter().any(|p| userinfo.starts_with(p))
        || (userinfo.len() >= 32
            && userinfo
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
    tokenish.then_some("a URL with a token")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_with_credentials_are_told_from_plain_ones() {
        assert_eq!(
            url_credential("https://x-access-token:ghs_abc@github.com/o/r"),
            Some("a URL with a password")
        );
        assert_eq!(
            url_credential("https://ghp_abc@github.com/o/r"),
            Some("a URL with a token")
        );
        assert_eq!(url_credential("https://alice@github.com/o/r"), None);
        assert_eq!(url_credential("git@github.com:o/r.git"), None);
        assert_eq!(url_credential("ssh://git@host/r"), None);
        assert_eq!(url_credential("https://github.com/o/r@v1"), None);
        assert_eq!(url_credential("origin"), None);
        assert_eq!(
            without_userinfo("https://x:ghs_1@github.com/o/r@v1"),
            "https://github.com/o/r@v1"
        );
        assert_eq!(
            without_userinfo("git@github.com:o/r.git"),
            "git@github.com:o/r.git"
        );
    }

    #[test]
    fn what_actions_checkout_leaves_is_found_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config");
        std::fs::write(
            &cfg,
            "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://github.com/o/r\n[http \"https://github.com/\"]\n\textraheader = AUTHORIZATION: basic eC1hY2Nlc3M=\n[include]\n\tpath = more\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("more"),
            "[remote \"fork\"]\n\turl = https://u:secret@example.com/r\n",
        )
        .unwrap();
        let mut out = Vec::new();
        scan(&cfg, 0, &mut out);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(
            (out[0].line, out[0].what.as_str()),
            (6, "http.https://github.com/.extraheader")
        );
        assert_eq!(out[1].file, dir.path().join("more"));
        assert_eq!(out[1].line, 2);
        assert!(!format!("{}", out[0]).contains("eC1h"), "never the value");
        assert!(!format!("{}", out[1]).contains("secret"), "never the value");
    }
}
