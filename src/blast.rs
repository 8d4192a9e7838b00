//! The blast radius (DESIGN §9): a path may be edited only when, after resolving `..` and
//! symlinks, it lies inside the loop's root (worktree or project), matches an `allow`
//! glob and no `deny` glob. `.git/` and `.loopflow/` are always denied.

use std::path::{Component, Path, PathBuf};

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

use crate::config::LoopConfig;

pub const ALWAYS_DENIED: &[&str] = &[
    ".git",
    ".git/**",
    ".loopflow",
    ".loopflow/**",
    "**/.git",
    "**/.git/**",
];

pub struct Radius {
    root: PathBuf,
    allow: GlobSet,
    allow_all: bool,
    deny: GlobSet,
}

fn glob(pattern: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(pattern).literal_separator(true).build()
}

/// Removes `.` and resolves `..` lexically (for the part of a path that does not exist).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Resolves symlinks in the longest existing prefix, then `..` in the rest.
pub fn resolve(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let abs = normalize(&abs);
    let mut existing = abs.clone();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = existing.canonicalize() {
            let mut out = c;
            for r in rest.iter().rev() {
                out.push(r);
            }
            return normalize(&out);
        }
        match (
            existing.file_name().map(|f| f.to_os_string()),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => return abs,
        }
    }
}

impl Radius {
    pub fn new(root: &Path, config: &LoopConfig) -> Result<Radius, String> {
        let root = root
            .canonicalize()
            .map_err(|e| format!("{}: {e}", root.display()))?;
        let mut allow = GlobSetBuilder::new();
        for g in &config.allow {
            allow.add(glob(&g.value).map_err(|e| e.to_string())?);
        }
        let mut deny = GlobSetBuilder::new();
        for g in &config.deny {
            deny.add(glob(&g.value).map_err(|e| e.to_string())?);
        }
        // Case-insensitive: on macOS and Windows `.GIT/config` *is* `.git/config`.
        for g in ALWAYS_DENIED {
            let always = GlobBuilder::new(g)
                .literal_separator(true)
                .case_insensitive(true)
                .build()
                .map_err(|e| e.to_string())?;
            deny.add(always);
        }
        Ok(Radius {
            root,
            allow_all: config.allow.is_empty(),
            allow: allow.build().map_err(|e| e.to_string())?,
            deny: deny.build().map_err(|e| e.to_string())?,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `Ok(relative path)` when `path` may be edited; otherwise why not.
    pub fn check(&self, path: &Path) -> Result<PathBuf, String> {
        let resolved = resolve(path);
        let rel = resolved
            .strip_prefix(&self.root)
            .map_err(|_| {
                format!(
                    "outside the loop's root {} (resolves to {})",
                    self.root.display(),
                    resolved.display()
                )
            })?
            .to_path_buf();
        if rel.as_os_str().is_empty() {
            return Err("is the loop's root itself".into());
        }
        let rel_s = rel.to_string_lossy().replace('\\', "/");
        if self.deny.is_match(&rel_s) {
            return Err(format!("`{rel_s}` matches a deny glob"));
        }
        if !self.allow_all && !self.allow.is_match(&rel_s) {
            return Err(format!("`{rel_s}` matches no allow glob"));
        }
        Ok(rel)
    }
}
