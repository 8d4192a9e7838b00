//! Verdict caching (opt-in, `[roles.<role>] cache = true`): when the task and the artifact
//! are the same as an earlier tick's, the role's earlier stdout is replayed instead of
//! running it again. The artifact is the implement node's `{{output}}` file when the agent
//! wrote one, else the content of the working tree (uncommitted changes included;
//! `.loopflow/` and git-ignored files left out).

use std::path::Path;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::Role;
use crate::git::Repo;
use crate::node::{NodeCtx, NodeOutput, OUTPUT_CAP};

/// How many verdicts a role's cache keeps (oldest dropped first).
const MAX_ENTRIES: usize = 64;

#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    entries: IndexMap<String, Entry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    tick: u64,
    stdout: String,
}

/// The cache key's hasher: BLAKE3 over length-prefixed fields, so ("ab","c") and
/// ("a","bc") differ. A collision would replay another artifact's (maybe passing) verdict,
/// so the key is a cryptographic hash, not a fast non-cryptographic one.
struct Key(blake3::Hasher);

impl Key {
    fn new() -> Self {
        Key(blake3::Hasher::new())
    }
    fn field(&mut self, bytes: &[u8]) {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }
    fn hex(self) -> String {
        self.0.finalize().to_hex().to_string()
    }
}

fn cache_path(ctx: &NodeCtx<'_>, role: &str) -> std::path::PathBuf {
    ctx.scope().cache_dir.join(format!("{role}.json"))
}

/// Why the cache key could not be computed (the tick then runs without the cache).
#[derive(Debug, thiserror::Error)]
pub(super) enum CacheError {
    #[error("{}: {error}", path.display())]
    Read {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
}

/// The cache key: task, artifact, and the role's prompt template (a changed verifier
/// prompt must re-grade).
pub(super) fn key(ctx: &NodeCtx<'_>, cfg: &Role, vars: &Value) -> Result<String, CacheError> {
    let mut h = Key::new();
    h.field(ctx.scope().task().map_or("", |t| t.id.as_str()).as_bytes());
    let artifact = vars
        .get("artifact")
        .and_then(Value::as_str)
        .map(Path::new)
        .filter(|p| p.is_file());
    match artifact {
        Some(p) => {
            h.field(b"artifact-file");
            h.field(&std::fs::read(p).map_err(|error| CacheError::Read {
                path: p.to_path_buf(),
                error,
            })?);
        }
        None => {
            h.field(b"working-tree");
            tree_hash(ctx.scope().cwd, repo_of(ctx).as_ref(), &mut h)?;
        }
    }
    if let Some((p, _)) = &cfg.prompt {
        h.field(&std::fs::read(p).unwrap_or_default());
    }
    Ok(h.hex())
}

/// The repository the tick works in: the loop's own for a worktree loop (never found
/// through the work tree's `.git`, an agent's to rewrite), else the checkout's.
fn repo_of(ctx: &NodeCtx<'_>) -> Option<Repo> {
    let scope = ctx.scope();
    if !scope.config.worktree {
        return Repo::checkout(scope.cwd).ok().flatten();
    }
    let copy = crate::worktree::location(
        scope.project,
        scope.loop_name,
        scope.config.worktree_dir.as_deref(),
    )
    .ok()?;
    copy.exists()
        .then(|| Repo::copy(&copy.git_dir, &copy.work_tree))
}

/// Hashes every file of the working tree that git would see (tracked and untracked, not
/// ignored), or every file when `dir` is not in a git repository; `.loopflow/` and `.git/`
/// are always left out.
fn tree_hash(dir: &Path, repo: Option<&Repo>, h: &mut Key) -> Result<(), CacheError> {
    let listed = repo.and_then(|r| r.files().ok());
    let mut files: Vec<String> = match listed {
        Some(l) => l.iter().map(|p| p.to_string_lossy().into_owned()).collect(),
        None => {
            let mut out = Vec::new();
            walk(dir, dir, &mut out)?;
            out
        }
    };
    files.retain(|f| !f.starts_with(".loopflow/") && !f.starts_with(".git/"));
    files.sort();
    files.dedup();
    for f in files {
        h.field(f.as_bytes());
        // As git sees it: a symlink is its target text, and only regular files are read
        // (a symlink to /dev/zero or a fifo must not exhaust memory or block the tick).
        let p = dir.join(&f);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                h.field(b"\0symlink");
                h.field(
                    std::fs::read_link(&p)
                        .unwrap_or_default()
                        .to_string_lossy()
                        .as_bytes(),
                );
            }
            Ok(m) if m.is_file() => match std::fs::read(&p) {
                Ok(bytes) => h.field(&bytes),
                Err(_) => h.field(b"\0unreadable"),
            },
            Ok(_) => h.field(b"\0special"),
            // Deleted but still tracked: the deletion is part of the content.
            Err(_) => h.field(b"\0deleted"),
        }
    }
    Ok(())
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), CacheError> {
    let entries = std::fs::read_dir(dir).map_err(|error| CacheError::Read {
        path: dir.to_path_buf(),
        error,
    })?;
    for e in entries.flatten() {
        let p = e.path();
        let Ok(rel) = p.strip_prefix(root) else {
            continue;
        };
        let rel = rel.to_string_lossy().replace('\\', "/");
        if rel == ".loopflow" || rel == ".git" {
            continue;
        }
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(root, &p, out)?,
            Ok(t) if t.is_file() => out.push(rel),
            _ => {}
        }
    }
    Ok(())
}

fn load(path: &Path) -> CacheFile {
    crate::fs_safe::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// On a hit, writes the cached stdout where the node's stdout would go and returns the
/// node's output marked `cached`.
pub(super) fn replay(ctx: &NodeCtx<'_>, role: &str, key: &str) -> Option<NodeOutput> {
    let cache = load(&cache_path(ctx, role));
    let entry = cache.entries.get(key)?;
    let id = ctx.id();
    let stdout = ctx.output_file(id, "stdout");
    let stderr = ctx.output_file(id, "stderr");
    crate::fs_safe::write_owned(&stdout, entry.stdout.as_bytes()).ok()?;
    let note = format!(
        "loopflow: verdict cache hit (task and artifact as in tick {}); {role} was not run\n",
        entry.tick
    );
    crate::fs_safe::write_owned(&stderr, note.as_bytes()).ok()?;
    let cut = &entry.stdout.as_bytes()[..entry.stdout.len().min(OUTPUT_CAP)];
    Some(NodeOutput {
        exit_code: Some(0),
        stdout_path: Some(stdout),
        stderr_path: Some(stderr),
        output: Some(String::from_utf8_lossy(cut).into_owned()),
        cached: true,
        ..Default::default()
    })
}

/// Remembers a successful run's stdout under `key` when it holds a verdict (best-effort: a cache that cannot be
/// written only means the next identical tick grades again).
pub(super) fn store(ctx: &NodeCtx<'_>, role: &str, key: &str, stdout: Option<&Path>) {
    let Some(text) = stdout.and_then(|p| crate::fs_safe::read_to_string(p).ok()) else {
        return;
    };
    // Only a verdict is worth replaying: output that does not parse halts the loop, and
    // after a human fixes the verifier the next tick must really run it again. An agent
    // whose output is a JSON envelope (a preset's usage rule) has the verdict inside it.
    let usage = ctx.config().agent(role).usage;
    let answer = (!usage.is_empty())
        .then(|| crate::preset::extract(&usage, &text).text)
        .flatten();
    if crate::verdict::parse(answer.as_deref().unwrap_or(&text)).is_err() {
        return;
    }
    let path = cache_path(ctx, role);
    let mut cache = load(&path);
    cache.entries.shift_remove(key);
    cache.entries.insert(
        key.to_string(),
        Entry {
            tick: ctx.scope().tick,
            stdout: text,
        },
    );
    while cache.entries.len() > MAX_ENTRIES {
        cache.entries.shift_remove_index(0);
    }
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let Ok(json) = serde_json::to_string(&cache) else {
        return;
    };
    // Best effort: a cache that cannot be written is only a cache missed next time.
    let _ = crate::fs_safe::write_atomic(dir, &path, json.as_bytes());
}
