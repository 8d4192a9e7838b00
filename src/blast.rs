//! The blast radius (DESIGN §9): a path may be edited only when, after resolving `..` and
//! symlinks, it lies inside the loop's root (worktree or project), matches an `allow`
//! glob and no `deny` glob. `.git/` and `.loopflow/` are always denied.

use std::path::{Component, Path, PathBuf};

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

use crate::toml_read::Str;

/// Where agents write their `{{output}}` files, in their working directory: git-ignored
/// by a `.gitignore` of its own, never part of the work.
pub const OUTPUT_DIR: &str = ".loopflow-out";

pub const ALWAYS_DENIED: &[&str] = &[
    ".git",
    ".git/**",
    ".loopflow",
    ".loopflow/**",
    ".loopflow-out",
    ".loopflow-out/**",
    "**/.git",
    "**/.git/**",
];

/// Why a radius could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RadiusError {
    #[error("{}: {source}", root.display())]
    Root {
        root: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Glob(#[from] globset::Error),
}

/// Why a path is outside the radius (the message completes "refused: PATH: …").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("outside the loop's root {} (resolves to {})", root.display(), resolved.display())]
    Outside { root: PathBuf, resolved: PathBuf },
    #[error("is the loop's root itself")]
    Root,
    #[error("`{0}` matches a deny glob")]
    Denied(String),
    #[error("`{0}` matches no allow glob")]
    NotAllowed(String),
}

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

/// Resolves a path the way the OS would when writing to it: component by component,
/// following every symlink where it stands (so `link/..` is the parent of the link's
/// *target*, not lexically the directory holding the link), including a dangling symlink
/// (writing through it creates its target). Parts that do not exist are taken lexically.
pub fn resolve(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    resolve_in(&abs, 0)
}

/// Symlink hops before giving up (the kernel's limit is 40).
const MAX_HOPS: usize = 40;

fn resolve_in(abs: &Path, hops: usize) -> PathBuf {
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::Prefix(_) | Component::RootDir => out.push(c.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => {
                out.push(name);
                if let Ok(real) = out.canonicalize() {
                    out = real;
                } else if hops < MAX_HOPS
                    && std::fs::symlink_metadata(&out).is_ok_and(|m| m.file_type().is_symlink())
                    && let Ok(target) = std::fs::read_link(&out)
                {
                    // A dangling symlink: where it points is where a write lands.
                    let parent = out.parent().map(Path::to_path_buf).unwrap_or_default();
                    out = resolve_in(&parent.join(target), hops + 1);
                }
            }
        }
    }
    normalize(&out)
}

impl Radius {
    /// The radius rooted at `root` (resolved), from a loop's `allow` and `deny` globs;
    /// each glob set is compiled once, so checking a path costs one match per set.
    pub fn new(
        root: &Path,
        allow_globs: &[Str],
        deny_globs: &[Str],
    ) -> Result<Radius, RadiusError> {
        let root = root.canonicalize().map_err(|source| RadiusError::Root {
            root: root.to_path_buf(),
            source,
        })?;
        let mut allow = GlobSetBuilder::new();
        for g in allow_globs {
            allow.add(glob(&g.value)?);
        }
        let mut deny = GlobSetBuilder::new();
        for g in deny_globs {
            deny.add(glob(&g.value)?);
        }
        // Case-insensitive: on macOS and Windows `.GIT/config` *is* `.git/config`.
        for g in ALWAYS_DENIED {
            let always = GlobBuilder::new(g)
                .literal_separator(true)
                .case_insensitive(true)
                .build()?;
            deny.add(always);
        }
        Ok(Radius {
            root,
            allow_all: allow_globs.is_empty(),
            allow: allow.build()?,
            deny: deny.build()?,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `Ok(relative path)` when `path` may be edited; otherwise why not.
    pub fn check(&self, path: &Path) -> Result<PathBuf, Refusal> {
        let resolved = resolve(path);
        let Ok(rel) = resolved.strip_prefix(&self.root) else {
            return Err(Refusal::Outside {
                root: self.root.clone(),
                resolved,
            });
        };
        let rel = rel.to_path_buf();
        if rel.as_os_str().is_empty() {
            return Err(Refusal::Root);
        }
        let rel_s = rel.to_string_lossy().replace('\\', "/");
        if self.deny.is_match(&rel_s) {
            return Err(Refusal::Denied(rel_s));
        }
        if !self.allow_all && !self.allow.is_match(&rel_s) {
            return Err(Refusal::NotAllowed(rel_s));
        }
        Ok(rel)
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn dotdot_after_a_symlink_leaves_from_the_target() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        symlink("/etc", root.join("src/etc")).unwrap();
        // Lexically `src/tmp/x`; for the OS `/etc/../tmp/x` = `/tmp/x`.
        assert_eq!(
            resolve(&root.join("src/etc/../tmp/x")),
            PathBuf::from("/tmp/x")
        );
        // A directory that does not exist yet, then `..`, then the symlink.
        assert_eq!(
            resolve(&root.join("src/new/../etc/passwd")),
            PathBuf::from("/etc/passwd")
        );
        assert_eq!(resolve(&root.join("src/a/../b.rs")), root.join("src/b.rs"));
    }

    #[test]
    fn a_dangling_symlink_resolves_to_where_a_write_would_land() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        symlink("/nonexistent-dir/new-file", root.join("d")).unwrap();
        assert_eq!(
            resolve(&root.join("d")),
            PathBuf::from("/nonexistent-dir/new-file")
        );
        symlink("../outside", root.join("rel")).unwrap();
        assert_eq!(
            resolve(&root.join("rel")),
            root.parent().unwrap().join("outside")
        );
        // A loop of links ends instead of spinning.
        symlink("b", root.join("a")).unwrap();
        symlink("a", root.join("b")).unwrap();
        let _ = resolve(&root.join("a"));
    }
}
