//! The git loopflow works with, and how much of it a tick starts: worktrees of the old
//! layout with relative records (git ≥ 2.48 with `worktree.useRelativePaths` writes them;
//! written here by hand so the test runs on any git), and the `git` processes a worktree
//! tick spawns, counted by a `git` on PATH that logs its arguments before running the
//! real one.

use std::path::{Component, Path, PathBuf};

use crate::isolation::{commits, git_commit_project};
use crate::support::{Project, git};

/// `to` relative to the directory `from` (both absolute and canonical).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let f: Vec<Component> = from.components().collect();
    let t: Vec<Component> = to.components().collect();
    let same = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in same..f.len() {
        out.push("..");
    }
    for c in &t[same..] {
        out.push(c);
    }
    out
}

/// Rewrites both records of `worktree` the way git 2.48's `worktree.useRelativePaths`
/// does: the admin directory's `gitdir` relative to itself, the worktree's `.git`
/// relative to the worktree.
fn make_records_relative(worktree: &Path) {
    let wt = worktree.canonicalize().unwrap();
    let dotgit = std::fs::read_to_string(wt.join(".git")).unwrap();
    let admin = PathBuf::from(dotgit.trim().strip_prefix("gitdir: ").unwrap());
    let admin = admin.canonicalize().unwrap();
    let back = relative(&admin, &wt.join(".git"));
    let there = relative(&wt, &admin);
    assert!(back.is_relative() && there.is_relative());
    std::fs::write(admin.join("gitdir"), format!("{}\n", back.display())).unwrap();
    std::fs::write(wt.join(".git"), format!("gitdir: {}\n", there.display())).unwrap();
}

/// A loop of the old layout — its worktree a linked worktree of the user's repository,
/// inside the loop's directory, with relative records as git ≥ 2.48 writes them and work
/// left uncommitted — moves to its place at its next tick, nothing lost: the work it held
/// is in the new worktree (and this tick's commit), the old worktree and its record gone.
#[test]
fn a_worktree_of_the_old_layout_moves_out_at_the_next_tick_with_its_work() {
    let (p, w) = git_commit_project("mkdir -p src && echo 'fn main() {}' > src/main.rs");
    // The old layout, as an older loopflow made it.
    std::fs::remove_dir_all(&w).unwrap();
    std::fs::remove_dir_all(p.loop_git_dir("g")).unwrap();
    let old = p.loop_dir("g").join("worktree");
    git(
        p.path(),
        &[
            "worktree",
            "add",
            "-q",
            &old.display().to_string(),
            "loopflow/g",
        ],
    );
    make_records_relative(&old);
    std::fs::create_dir_all(old.join("src")).unwrap();
    std::fs::write(old.join("src/wip.rs"), "// unsaved\n").unwrap();
    std::fs::write(old.join("README.md"), "# edited in the old worktree\n").unwrap();
    p.edit_state("g", |s| {
        s["worktree_path"] = old.display().to_string().into()
    });

    let r = p.lf(&["run", "--loop", "g", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let ev = p.events("g");
    assert!(
        ev.iter().any(|e| e.starts_with("WORKTREE moved=")),
        "{ev:?}"
    );
    assert!(ev.iter().any(|e| e.contains("carried=2")), "{ev:?}");
    let new = p.worktree("g");
    assert_ne!(new, old);
    assert!(!new.starts_with(p.path()));
    assert!(!old.exists(), "the old worktree stays: {ev:?}");
    assert!(!git(p.path(), &["worktree", "list"]).contains("loopflow/g"));
    // The old worktree's work, and the tick's, on the branch.
    for (f, text) in [
        ("src/wip.rs", "// unsaved\n"),
        ("README.md", "# edited in the old worktree\n"),
        ("src/main.rs", "fn main() {}\n"),
    ] {
        assert_eq!(
            git(p.path(), &["show", &format!("loopflow/g:{f}")]),
            text,
            "{f}"
        );
    }
    assert_eq!(commits(p.path(), "loopflow/g"), 2);
}

/// A directory holding a `git` that appends its arguments to `log`, then runs the git
/// that was first on PATH.
fn logging_git(p: &Project, log: &Path) -> String {
    let path = std::env::var_os("PATH").unwrap();
    let real = std::env::split_paths(&path)
        .map(|d| d.join("git"))
        .find(|g| g.is_file())
        .expect("git on PATH");
    p.script(
        "bin/git",
        &format!(
            "printf '%s\\n' \"$*\" >> '{}'\nexec '{}' \"$@\"",
            log.display(),
            real.display()
        ),
    );
    let mut dirs = vec![p.join("bin")];
    dirs.extend(std::env::split_paths(&path));
    std::env::join_paths(dirs).unwrap().into_string().unwrap()
}

/// Every git command the tick ran, by its subcommand (what follows the `-c` and `--`
/// options).
fn subcommands(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut words = l.split(' ');
            let mut sub = "";
            while let Some(w) = words.next() {
                if w == "-c" {
                    words.next();
                } else if !w.starts_with("--") {
                    sub = w;
                    break;
                }
            }
            sub.to_string()
        })
        .collect()
}

#[test]
fn a_worktree_tick_that_changes_nothing_starts_no_git_once_the_index_is_settled() {
    let (p, w) = git_commit_project("true");
    let log = p.join("git.log");
    let path = logging_git(&p, &log);
    // Right after `create` the checked-out files share the index's timestamp (racily
    // clean, in git's words): only `git status` can tell, and it rewrites the index.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let r = p.lf_env(&["run", "--loop", "g", "--json"], &[("PATH", &path)]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert!(subcommands(&log).len() <= 1, "{:?}", subcommands(&log));
    // From then on a tick whose agents changed nothing starts no git process at all: the
    // refs, the common directory and the index are read from the files.
    for _ in 0..2 {
        let _ = std::fs::remove_file(&log);
        let r = p.lf_env(&["run", "--loop", "g", "--json"], &[("PATH", &path)]);
        assert_eq!(r.json()["outcome"], "tick", "{r:?}");
        assert_eq!(subcommands(&log), Vec::<String>::new(), "{r:?}");
    }
    assert_eq!(commits(p.path(), "loopflow/g"), 1);
    // An edit that keeps the file's size is still seen (its timestamps moved): git runs,
    // and the change is committed.
    std::fs::write(w.join("README.md"), "# test projecT\n").unwrap();
    let r = p.lf_env(&["run", "--loop", "g", "--json"], &[("PATH", &path)]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(subcommands(&log)[0], "status", "{r:?}");
    assert_eq!(commits(p.path(), "loopflow/g"), 2);
    // So is a new file, and a file the agent only staged.
    let _ = std::fs::remove_file(&log);
    std::fs::write(w.join("new.md"), "new\n").unwrap();
    let r = p.lf_env(&["run", "--loop", "g", "--json"], &[("PATH", &path)]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(commits(p.path(), "loopflow/g"), 3);
    std::fs::write(w.join("staged.md"), "s\n").unwrap();
    git(&w, &["add", "staged.md"]);
    let r = p.lf_env(&["run", "--loop", "g", "--json"], &[("PATH", &path)]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(
        commits(p.path(), "loopflow/g"),
        4,
        "the staged file was committed"
    );

    // A change: staged, compared and committed by git, the refs still read in-process.
    let (p, _w) = git_commit_project("mkdir -p src && echo x > src/a.rs");
    let log = p.join("git.log");
    let path = logging_git(&p, &log);
    let r = p.lf_env(&["run", "--loop", "g", "--json"], &[("PATH", &path)]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(commits(p.path(), "loopflow/g"), 2);
    assert_eq!(
        subcommands(&log),
        [
            // Around the verifier (what it leaves is not the tick's work), then the commit's.
            "status",
            "status",
            "status",
            "add",
            "write-tree",
            "diff-tree",
            "commit-tree",
            "update-ref",
            "fetch"
        ],
        "{r:?}"
    );
}

/// Only what `status` lists is staged (not `add -A .`): a tick that deletes, edits, adds
/// in a new directory and renames (staged by the agent, then edited) commits exactly
/// those changes.
#[test]
fn the_commit_holds_every_kind_of_change_status_lists() {
    let (p, w) = git_commit_project(
        "rm src/gone.rs && echo edited >> src/kept.rs && mkdir -p src/new/deep && echo n > src/new/deep/n.rs && git mv src/old.rs src/moved.rs && echo more >> src/moved.rs",
    );
    std::fs::create_dir_all(w.join("src")).unwrap();
    for f in ["gone", "kept", "old"] {
        std::fs::write(w.join(format!("src/{f}.rs")), format!("{f}\n")).unwrap();
    }
    crate::support::commit_all(&w, "files");
    let r = p.lf(&["run", "--loop", "g", "--json"]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let changes = git(
        &w,
        &[
            "diff-tree",
            "--no-commit-id",
            "-r",
            "--name-status",
            "HEAD~1",
            "HEAD",
        ],
    );
    let mut lines: Vec<&str> = changes.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "A\tsrc/moved.rs",
            "A\tsrc/new/deep/n.rs",
            "D\tsrc/gone.rs",
            "D\tsrc/old.rs",
            "M\tsrc/kept.rs"
        ],
        "{changes}"
    );
    // The renamed file as the agent left it: staged, then edited.
    assert_eq!(git(&w, &["show", "HEAD:src/moved.rs"]), "old\nmore\n");
    assert!(
        git(&w, &["status", "--porcelain"]).is_empty(),
        "all of it committed"
    );
}
