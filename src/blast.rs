//! The blast radius (DESIGN §9): a path may be edited only when, after resolving `..` and
//! symlinks, it lies inside the loop's root (worktree or project), matches an `allow`
//! glob and no `deny` glob. `.git/` and `.loopflow/` are always denied.
//!
//! Globs match as globset matches them (`*` stays within a path segment). A loop may list
//! 100,000 of them, and globset compiles a regex for each (~125,000 instructions apiece:
//! 3 s before the first path was checked), so they are indexed instead: a glob whose first
//! segments are literal (`src/parser/**/*.rs`) can only match paths that begin with those
//! segments, and sits in a tree keyed by them; the globs of one tree node are compiled
//! together, once, when a path first reaches that node. Globs that begin with a wildcard
//! (`**/*.md`) are compiled together up front. Cost: building is linear in the globs'
//! text; a path costs one step per leading segment plus the match of the globs on its way.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

use crate::toml_read::Str;

/// Where agents write their `{{output}}` files, in their working directory: git-ignored
/// by a `.gitignore` of its own, never part of the work.
pub(crate) const OUTPUT_DIR: &str = ".loopflow-out";

/// Build output that a fresh project of its language would git-ignore (DESIGN §9): never
/// committed as a loop's work — written to the loop repository's `info/exclude`, so git
/// does not even list it — unless the blast radius `allow`s it by name
/// ([`allowed_by_name`]). Only untracked files are kept out: what the project already
/// tracks under these names is the project's.
pub(crate) const BUILD_OUTPUT: &[&str] = &[
    // Rust, Java (Maven)
    "target/",
    // Node
    "node_modules/",
    "dist/",
    ".next/",
    "coverage/",
    ".nyc_output/",
    // Python
    "__pycache__/",
    "*.pyc",
    "*.pyo",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".tox/",
    ".nox/",
    "*.egg-info/",
    ".coverage",
    ".coverage.*",
    "htmlcov/",
    // Java (Gradle), Kotlin
    ".gradle/",
    "*.class",
];

/// Whether an `allow` glob names build-output `pattern`: a glob with a path component
/// that is the directory's name (`dist/**`, `**/__pycache__/*`), or, for a file pattern
/// (`*.pyc`), one that ends in it (`**/*.pyc`). `**` alone names nothing.
pub(crate) fn allowed_by_name(pattern: &str, allow: &[String]) -> bool {
    match pattern.strip_suffix('/') {
        Some(dir) => allow
            .iter()
            .any(|g| g.split('/').any(|c| c == dir || c == pattern)),
        None => {
            let tail = pattern.trim_start_matches('*');
            allow.iter().any(|g| {
                let last = g.rsplit('/').next().unwrap_or(g);
                last == pattern || (!tail.is_empty() && last.ends_with(tail) && last != "*")
            })
        }
    }
}

pub(crate) const ALWAYS_DENIED: &[&str] = &[
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
pub(crate) enum RadiusError {
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
pub(crate) enum Refusal {
    #[error("outside the loop's root {} (resolves to {})", root.display(), resolved.display())]
    Outside { root: PathBuf, resolved: PathBuf },
    #[error("is the loop's root itself")]
    Root,
    #[error("`{0}` matches a deny glob")]
    Denied(String),
    #[error("`{0}` matches no allow glob")]
    NotAllowed(String),
}

pub(crate) struct Radius {
    root: PathBuf,
    allow: Globs,
    allow_all: bool,
    deny: Globs,
    /// [`ALWAYS_DENIED`], case-insensitive.
    always: GlobSet,
}

fn glob(pattern: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(pattern).literal_separator(true).build()
}

/// Whether `pattern` is a glob globset accepts: at once for the common shapes (segments
/// of letters, digits, `.`, `_`, `-`, `*` and `?`, and `**` segments, which cannot be
/// invalid), else by globset's own parser. `check` uses this too.
pub(crate) fn validate_glob(pattern: &str) -> Result<(), globset::Error> {
    if plainly_valid(pattern) {
        return Ok(());
    }
    Glob::new(pattern).map(|_| ())
}

fn plainly_valid(pattern: &str) -> bool {
    pattern.split('/').all(|seg| {
        seg == "**"
            || (!seg.contains("**")
                && seg.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'*' | b'?')
                }))
    })
}

/// A segment with nothing globset reads as a wildcard, class, alternation or escape.
fn is_literal(seg: &str) -> bool {
    !seg.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

/// A set of globs, indexed by their literal leading segments (see the module's doc).
struct Globs {
    /// The tree: (parent node, segment) -> child node, one table for all nodes.
    edges: HashMap<(u32, Box<str>), u32>,
    /// Per node: the globs whose literal leading segments lead exactly there.
    nodes: Vec<Vec<u32>>,
    /// Per node: those globs compiled together once asked; `None` if they would not
    /// compile.
    sets: Vec<OnceLock<Option<GlobSet>>>,
    patterns: Vec<String>,
    /// The globs with no literal first segment, compiled up front.
    general: GlobSet,
    /// What a node whose globs cannot be compiled answers (never expected: every glob is
    /// validated first): `true` for a deny set, `false` for an allow set, so either way
    /// the path is refused.
    if_broken: bool,
}

impl Globs {
    fn new(patterns: &[Str], if_broken: bool) -> Result<Globs, globset::Error> {
        let mut g = Globs {
            edges: HashMap::new(),
            nodes: vec![Vec::new()],
            sets: Vec::new(),
            patterns: Vec::with_capacity(patterns.len()),
            general: GlobSet::empty(),
            if_broken,
        };
        let mut general = GlobSetBuilder::new();
        for p in patterns {
            validate_glob(&p.value)?;
            let mut at = 0u32;
            let mut lead = 0;
            // Literal segments, up to the first that is not (a whole literal glob indexes
            // by all of them).
            for seg in p.value.split('/').take_while(|s| is_literal(s)) {
                lead += 1;
                let next = g.nodes.len() as u32;
                at = *g.edges.entry((at, seg.into())).or_insert_with(|| next);
                if at == next {
                    g.nodes.push(Vec::new());
                }
            }
            if lead == 0 {
                general.add(glob(&p.value)?);
                continue;
            }
            g.nodes[at as usize].push(g.patterns.len() as u32);
            g.patterns.push(p.value.clone());
        }
        g.general = general.build()?;
        g.sets = (0..g.nodes.len()).map(|_| OnceLock::new()).collect();
        Ok(g)
    }

    /// Whether any glob matches `path` (`/`-separated, relative).
    fn is_match(&self, path: &str) -> bool {
        if self.general.is_match(path) {
            return true;
        }
        let mut at = 0u32;
        for seg in path.split('/') {
            let Some(&next) = self.edges.get(&(at, seg.into())) else {
                return false;
            };
            at = next;
            let globs = &self.nodes[at as usize];
            if globs.is_empty() {
                continue;
            }
            let set = self.sets[at as usize].get_or_init(|| {
                let mut b = GlobSetBuilder::new();
                for &i in globs {
                    b.add(glob(&self.patterns[i as usize]).ok()?);
                }
                b.build().ok()
            });
            match set {
                Some(s) if s.is_match(path) => return true,
                Some(_) => {}
                None => return self.if_broken,
            }
        }
        false
    }
}

/// Resolves a path the way the OS would when writing to it: component by component,
/// following every symlink where it stands (so `link/..` is the parent of the link's
/// *target*, not lexically the directory holding the link), including a dangling symlink
/// (writing through it creates its target). Parts that do not exist are taken lexically.
pub(crate) fn resolve(path: &Path) -> PathBuf {
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
    crate::fs_safe::normalize(&out)
}

impl Radius {
    /// The radius rooted at `root` (resolved), from a loop's `allow` and `deny` globs;
    /// each glob set is compiled once, so checking a path costs one match per set.
    pub(crate) fn new(
        root: &Path,
        allow_globs: &[Str],
        deny_globs: &[Str],
    ) -> Result<Radius, RadiusError> {
        let root = root.canonicalize().map_err(|source| RadiusError::Root {
            root: root.to_path_buf(),
            source,
        })?;
        // Case-insensitive: on macOS and Windows `.GIT/config` *is* `.git/config`.
        let mut always = GlobSetBuilder::new();
        for g in ALWAYS_DENIED {
            always.add(
                GlobBuilder::new(g)
                    .literal_separator(true)
                    .case_insensitive(true)
                    .build()?,
            );
        }
        Ok(Radius {
            root,
            allow_all: allow_globs.is_empty(),
            allow: Globs::new(allow_globs, false)?,
            deny: Globs::new(deny_globs, true)?,
            always: always.build()?,
        })
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// `Ok(relative path)` when `path` may be edited; otherwise why not.
    pub(crate) fn check(&self, path: &Path) -> Result<PathBuf, Refusal> {
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
        if self.always.is_match(&rel_s) || self.deny.is_match(&rel_s) {
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

    fn strs(v: &[String]) -> Vec<Str> {
        v.iter()
            .map(|s| Str {
                value: s.clone(),
                span: 0..0,
            })
            .collect()
    }

    /// The indexed set answers exactly what one globset of the same globs answers, and the
    /// quick validation never accepts a glob globset rejects.
    #[test]
    fn indexed_globs_match_like_one_globset() {
        let segs = [
            "src", "a", "b.rs", "**", "*", "*.rs", "a*", "?", "x?z", "[ab]", "{a,b}", "\\*",
            ".git", "***", "a**", "",
        ];
        let path_segs = ["src", "a", "b", "b.rs", "x.rs", "xyz", ".git", "*", "ab"];
        let mut seed = 3u64;
        let mut next = |m: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % m
        };
        for _ in 0..300 {
            let globs: Vec<String> = (0..1 + next(6))
                .map(|_| {
                    (0..1 + next(4))
                        .map(|_| segs[next(segs.len())])
                        .collect::<Vec<_>>()
                        .join("/")
                })
                .collect();
            for g in &globs {
                if plainly_valid(g) {
                    assert!(Glob::new(g).is_ok(), "{g:?} passed as plainly valid");
                }
            }
            let mut one = GlobSetBuilder::new();
            let mut ok = true;
            for g in &globs {
                match glob(g) {
                    Ok(x) => {
                        one.add(x);
                    }
                    Err(_) => ok = false,
                }
            }
            let ours = Globs::new(&strs(&globs), false);
            assert_eq!(ours.is_ok(), ok, "{globs:?}");
            let (Ok(ours), Ok(one)) = (ours, one.build()) else {
                continue;
            };
            for _ in 0..40 {
                let path = (0..1 + next(4))
                    .map(|_| path_segs[next(path_segs.len())])
                    .collect::<Vec<_>>()
                    .join("/");
                assert_eq!(
                    ours.is_match(&path),
                    one.is_match(&path),
                    "{globs:?} on {path:?}"
                );
            }
        }
    }

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
