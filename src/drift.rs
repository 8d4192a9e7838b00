//! Documentation drift (the seed's `last-read-sha`): a doc says which code it describes
//! and the commit at which it was last checked against that code. When the code has
//! changed in a commit the recorded one does not contain, the doc is a task for the
//! `design-update` loop. Markers, anywhere in a doc's first 40 lines (an HTML comment
//! keeps them out of rendered markdown):
//!
//! ```text
//! <!-- describes: src/brakes.rs src/node/ -->
//! <!-- last-read-sha: 3f2c1e0a… -->
//! ```
//!
//! `describes` takes git pathspecs (a directory means everything below it).

use std::path::{Path, PathBuf};

use crate::git::Repo;

/// A doc whose recorded last read is older than the last change to its code.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Drift {
    /// The doc's path relative to the repository root.
    pub doc: String,
    pub describes: Vec<String>,
    pub last_read: Option<String>,
    /// The newest commit touching the described paths.
    pub changed_in: String,
}

impl Drift {
    /// The task line an audit work source reads: JSON with `id` and `title`.
    pub(crate) fn task_json(&self) -> String {
        let short = |s: &str| s.chars().take(10).collect::<String>();
        let title = match &self.last_read {
            None => format!(
                "{}: no last-read-sha recorded; {} last changed in {}",
                self.doc,
                self.describes.join(" "),
                short(&self.changed_in)
            ),
            Some(r) => format!(
                "{}: {} changed in {} after last-read-sha {}",
                self.doc,
                self.describes.join(" "),
                short(&self.changed_in),
                short(r)
            ),
        };
        serde_json::json!({ "id": self.doc, "title": title }).to_string()
    }
}

/// The markers of one doc: (describes, last-read-sha).
pub(crate) fn markers(text: &str) -> (Vec<String>, Option<String>) {
    let mut describes = Vec::new();
    let mut last_read = None;
    for line in text.lines().take(40) {
        let l = line
            .trim()
            .trim_start_matches("<!--")
            .trim_end_matches("-->")
            .trim();
        if let Some(v) = l.strip_prefix("describes:") {
            describes.extend(v.split_whitespace().map(str::to_string));
        } else if let Some(v) = l.strip_prefix("last-read-sha:") {
            last_read = v.split_whitespace().next().map(str::to_string);
        }
    }
    (describes, last_read)
}

fn docs_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if p.file_name()
                .is_some_and(|n| n == ".git" || n == ".loopflow")
            {
                continue;
            }
            docs_under(&p, out);
        } else if p.extension().is_some_and(|e| e == "md") {
            out.push(p);
        }
    }
}

/// Every drifting doc under `dirs` (relative to `repo`, a git working tree), in path order.
pub(crate) fn find(repo: &Path, dirs: &[String]) -> Result<Vec<Drift>, String> {
    let checkout = Repo::checkout(repo)
        .map_err(|e| e.to_string())?
        .filter(|r| r.work_tree.is_some())
        .ok_or_else(|| format!("{} is not inside a git repository", repo.display()))?;
    let top = checkout.top().to_path_buf();
    // Absolute, symlinks resolved like git's toplevel, so docs are named relative to it.
    let repo = repo
        .canonicalize()
        .map_err(|e| format!("{}: {e}", repo.display()))?;
    let mut docs = Vec::new();
    for d in dirs {
        docs_under(&repo.join(d), &mut docs);
    }
    let mut out = Vec::new();
    for doc in docs {
        let text = std::fs::read_to_string(&doc).map_err(|e| format!("{}: {e}", doc.display()))?;
        let (describes, last_read) = markers(&text);
        if describes.is_empty() {
            continue;
        }
        let paths: Vec<&str> = describes.iter().map(String::as_str).collect();
        let Some(changed_in) = checkout.last_change(&paths).map_err(|e| e.to_string())? else {
            continue; // the described code has no history yet
        };
        let in_sync = match &last_read {
            None => false,
            Some(r) => checkout.is_ancestor(&changed_in, r),
        };
        if !in_sync {
            let rel = doc.strip_prefix(&top).unwrap_or(&doc);
            out.push(Drift {
                doc: rel.display().to_string().replace('\\', "/"),
                describes,
                last_read,
                changed_in,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_in_comments_or_plain() {
        let (d, r) = markers("# T\n<!-- describes: src/a.rs src/b/ -->\nlast-read-sha: abc123\n");
        assert_eq!(d, ["src/a.rs", "src/b/"]);
        assert_eq!(r.as_deref(), Some("abc123"));
        assert_eq!(markers("# nothing\n"), (Vec::new(), None));
    }
}
