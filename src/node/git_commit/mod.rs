//! `git-commit`: lands the tick's work on `loopflow/<name>` after checking every path the
//! tick changed against the blast radius (DESIGN §9) — uncommitted changes and commits the
//! agent made itself alike, renames as both sides, symlinks where they point, nested
//! repositories refused. The tick's tree becomes one commit on the branch tip the tick
//! started from (the agent's own commits are folded into it, their subjects kept in the
//! message). A violation halts `human_intervention:blast_radius` with the branch where the
//! tick found it and the changes left uncommitted for review. With worktrees off it
//! commits nothing but halts the same way on a path the tick changed outside the radius.

mod baseline;
mod leftovers;

use std::path::{Path, PathBuf};

pub(crate) use baseline::{Baseline, BaselineError};
pub(crate) use leftovers::Leftovers;

use crate::blast::{Radius, Refusal};
use crate::diag::Diagnostics;
use crate::git::{Change, GitError, MODE_GITLINK, MODE_SYMLINK, Repo};
use crate::node::{Key, KeyType, NodeCtx, NodeKind, NodeOutput, NodeRun, NodeSpec};
use crate::reason::{Failure, HaltReason, Intervention};
use crate::template::Tmpl;
use crate::toml_read::Table;
use crate::worktree::Copy;

pub(super) struct GitCommit;

const DEFAULT_MESSAGE: &str = "loopflow {{loop}}: iteration {{iteration}}";

/// A symlink target longer than this is refused unread (PATH_MAX).
const LINK_MAX: usize = 4096;

impl NodeKind for GitCommit {
    fn name(&self) -> &'static str {
        "git-commit"
    }
    fn about(&self) -> &'static str {
        "commits the tick's work on the loop's branch, refusing any path outside the blast radius"
    }
    fn keys(&self) -> &'static [Key] {
        &[Key {
            name: "message",
            ty: KeyType::String,
            about: "git-commit: the commit message template.",
        }]
    }
    fn parse(&self, t: &Table<'_, '_>, d: &mut Diagnostics) -> Option<Box<dyn NodeSpec>> {
        let message = t
            .str("message", d)
            .map(|s| Tmpl::literal(t.source, &s.value, s.span));
        Some(Box::new(GitCommitNode { message }))
    }
}

#[derive(Debug)]
struct GitCommitNode {
    message: Option<Tmpl>,
}

fn halt(detail: String) -> NodeRun {
    NodeRun::Halt {
        reason: HaltReason::HumanIntervention(Intervention::BlastRadius),
        detail: Some(detail),
    }
}

/// The loop's blast radius, compiled only once there is a change to judge (its globs
/// were checked when the loop loaded; compiling them is most of an idle tick's cost).
fn radius(ctx: &NodeCtx<'_>) -> Result<Radius, Failure> {
    let cfg = ctx.config();
    Radius::new(ctx.scope().cwd, &cfg.allow, &cfg.deny)
        .map_err(|e| Failure::BlastRadius(e.to_string()))
}

/// The tick's work could not be staged, checked or committed: the loop halts
/// (`human_intervention:commit_failed`) and the tick never counts as done.
fn failed(e: impl std::fmt::Display) -> NodeRun {
    NodeRun::Halt {
        reason: HaltReason::HumanIntervention(Intervention::CommitFailed),
        detail: Some(e.to_string()),
    }
}

impl NodeSpec for GitCommitNode {
    fn templates(&self) -> Vec<&Tmpl> {
        self.message.iter().collect()
    }

    fn wants_baseline(&self) -> bool {
        true
    }

    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun {
        let scope = ctx.scope();
        let baseline = match scope.baseline {
            Some(Ok(b)) => b,
            Some(Err(why)) => return halt(format!("{}: {why}", scope.cwd.display())),
            None => return failed("the tick took no baseline to compare against"),
        };
        match baseline {
            Baseline::Branch {
                repo,
                copy,
                base,
                leftovers,
            } => self.land(ctx, repo, copy, base, leftovers),
            Baseline::TooLarge => {
                ctx.warn(format!(
                    "more than {} files in a project without git: the tick's changes were not checked against the blast radius",
                    baseline::FILES_CAP
                ));
                NodeRun::Ok(NodeOutput::default())
            }
            other => {
                // Worktrees off: the work stays where the agent made it; only the radius.
                let changed = match other.changed_since(scope.cwd) {
                    Ok(c) => c,
                    Err(e) => return failed(e),
                };
                if changed.is_empty() {
                    return NodeRun::Ok(NodeOutput::default());
                }
                let radius = match radius(ctx) {
                    Ok(r) => r,
                    Err(why) => return NodeRun::fail(why),
                };
                let refused: Vec<Refused> = changed
                    .iter()
                    .filter_map(|p| on_disk(&radius, p).err())
                    .collect();
                if refused.is_empty() {
                    NodeRun::Ok(NodeOutput::default())
                } else {
                    halt(joined(&refused))
                }
            }
        }
    }

    fn dry_run(&self, ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        let m = self.message(ctx)?;
        let cwd = ctx.scope().cwd.display();
        Ok(Some(if ctx.config().worktree {
            format!(
                "would commit the tick's changes in {cwd} on loopflow/{} with message {m:?}, after checking each against the blast radius",
                ctx.scope().loop_name
            )
        } else {
            format!(
                "would check every path the tick changes in {cwd} against the blast radius (worktrees off: nothing is committed)"
            )
        }))
    }
}

impl GitCommitNode {
    fn message(&self, ctx: &NodeCtx<'_>) -> Result<String, String> {
        match &self.message {
            Some(t) => ctx.render(&t.text),
            None => ctx.render(DEFAULT_MESSAGE),
        }
        .map_err(|e| e.to_string())
    }

    /// Worktree: stage everything, compare the staged tree with the tick's base, and
    /// either make it one commit on the base or put the branch back on the base. The
    /// commit then goes to the loop's branch in the user's repository.
    fn land(
        &self,
        ctx: &NodeCtx<'_>,
        repo: &Repo,
        copy: &Copy,
        base: &str,
        leftovers: &leftovers::Leftovers,
    ) -> NodeRun {
        // The worktree must still be the loop's own (its `.git` put back if an agent
        // rewrote it), on its branch.
        // `.git` is always outside the radius: an agent that rewrote it (to make git
        // commit elsewhere, or run a filter it planted) gets nothing committed.
        match copy.open() {
            Ok((_, true)) => {
                return halt(format!(
                    ".git: the worktree's .git was rewritten to name another repository; loopflow pointed it back at the loop's own and committed nothing (the files are left in {} for review)",
                    copy.work_tree.display()
                ));
            }
            Ok(_) => {}
            Err(why) => return halt(format!("{}: {why}", copy.work_tree.display())),
        }
        let tip = |r: &Repo| r.rev(&copy.branch).ok().flatten();
        // Nothing changed, told from the index and the files: no git process at all.
        if tip(repo).as_deref() == Some(base) && repo.certainly_clean(base) {
            return NodeRun::Ok(NodeOutput::default());
        }
        let mut status = match repo.status(true) {
            Ok(p) => p,
            Err(e) => return failed(e),
        };
        // What the verifier, the orchestrator and `command` nodes left is not the tick's
        // work: put back as it was, and out of the commit.
        if let Err(e) = put_back_leftovers(ctx, repo, copy, leftovers, &mut status) {
            return failed(e);
        }
        // A clean worktree is the index is HEAD is the branch (HEAD names it: `open`
        // checked): with the branch still on the base, the tick changed nothing.
        if status.is_empty() && tip(repo).as_deref() == Some(base) {
            return NodeRun::Ok(NodeOutput::default());
        }
        // A nested repository makes `git add` fail (or record a gitlink): refused first.
        let nested: Vec<Refused> = status
            .iter()
            .flat_map(|e| std::iter::once(&e.path).chain(&e.orig))
            .filter(|p| copy.work_tree.join(p).join(".git").exists())
            .map(|p| Refused::Nested {
                path: p.display().to_string(),
            })
            .collect();
        if !nested.is_empty() {
            return halt(format!(
                "{} (nothing was committed; the files are left in the worktree for review)",
                joined(&nested)
            ));
        }
        // Everything status listed but the agents' output directory, which never lands.
        let out_dir = Path::new(crate::blast::OUTPUT_DIR);
        let to_stage: Vec<PathBuf> = status
            .into_iter()
            .filter(|e| e.unstaged && !e.path.starts_with(out_dir))
            .map(|e| e.path)
            .collect();
        if let Err(e) = repo.stage(&to_stage) {
            let _ = repo.reset_mixed(base);
            return failed(format!(
                "{e} (nothing was committed; the files are left in the worktree for review)"
            ));
        }
        let tree = match repo.write_tree() {
            Ok(t) => t,
            Err(e) => return failed(e),
        };
        let changes = match repo.diff_tree(base, &tree) {
            Ok(c) => c,
            Err(e) => return failed(e),
        };
        let refused: Vec<Refused> = if changes.is_empty() {
            Vec::new()
        } else {
            let radius = match radius(ctx) {
                Ok(r) => r,
                Err(why) => return failed(why),
            };
            changes
                .iter()
                .filter_map(|c| in_tree(&radius, repo, c).err())
                .collect()
        };
        let head = tip(repo);
        if !refused.is_empty() {
            // Branch and index back where the tick found them; the files stay for review.
            let reset = repo.reset_mixed(base);
            let mut detail = joined(&refused);
            match reset {
                Ok(_) => detail.push_str(&format!(
                    " (loopflow/{} is back at {}; the changes are left uncommitted in the worktree: `loopflow review`, then `loopflow discard` drops them)",
                    ctx.scope().loop_name,
                    short(base)
                )),
                Err(e) => detail.push_str(&format!(" (and resetting the branch failed: {e})")),
            }
            return halt(detail);
        }
        if changes.is_empty() && head.as_deref() == Some(base) {
            return NodeRun::Ok(NodeOutput::default());
        }
        let mut message = match self.message(ctx) {
            Ok(m) => m,
            Err(e) => return NodeRun::fail(Failure::Template(e)),
        };
        if head.as_deref() != Some(base)
            && let Ok(log) = repo.subjects(&format!("{base}..{}", copy.branch), 50, false)
            && !log.is_empty()
        {
            message.push_str("\n\nThe agent's own commits, folded into this one:\n");
            message.push_str(&log);
        }
        let commit = match repo.commit_tree(&tree, base, &message) {
            Ok(c) => c,
            Err(e) => return failed(e),
        };
        let old = head.unwrap_or_else(|| base.to_string());
        if let Err(e) = repo.move_ref(&copy.branch, &commit, &old, "loopflow git-commit") {
            return failed(e);
        }
        // The loop's branch in the user's repository: where `review`, `land` and people
        // see the work. A fast-forward only: a branch moved meanwhile is a human's to see.
        if let Err(e) = publish(ctx.scope().project, repo, &copy.branch) {
            return failed(format!(
                "committed {} in the loop's worktree, but {} of your repository could not take it: {e}",
                short(&commit),
                copy.branch.trim_start_matches("refs/heads/")
            ));
        }
        NodeRun::Ok(NodeOutput {
            exit_code: Some(0),
            output: Some(format!("{commit} {}", message.lines().next().unwrap_or(""))),
            ..Default::default()
        })
    }
}

/// Puts back what processes other than the implementers changed (see `leftovers.rs`):
/// tracked files as HEAD has them, files they created removed; one `WARN` names them.
/// A path an implementer had changed before them cannot be put back as the implementer
/// left it: it is committed as it is, and the `WARN` says so. `status` loses the paths
/// put back.
fn put_back_leftovers(
    ctx: &NodeCtx<'_>,
    repo: &Repo,
    copy: &Copy,
    leftovers: &leftovers::Leftovers,
    status: &mut Vec<crate::git::StatusEntry>,
) -> Result<(), GitError> {
    let listed: std::collections::HashSet<PathBuf> =
        crate::git::paths_of(status).into_iter().collect();
    let left = leftovers.take(&copy.work_tree, &listed);
    if left.is_empty() {
        return Ok(());
    }
    let untracked: std::collections::HashSet<&PathBuf> = status
        .iter()
        .filter(|e| &e.code == b"??")
        .map(|e| &e.path)
        .collect();
    let mut tracked = Vec::new();
    let mut put_back = Vec::new();
    let mut kept = Vec::new();
    for (p, l) in &left {
        if l.changed_before {
            kept.push(format!("{} ({})", p.display(), l.node));
            continue;
        }
        if untracked.contains(p) {
            let full = copy.work_tree.join(p);
            if std::fs::symlink_metadata(&full).is_ok() {
                std::fs::remove_file(&full).map_err(GitError::Spawn)?;
            }
        } else if listed.contains(p) {
            tracked.push(p.clone());
        }
        put_back.push(format!("{} ({})", p.display(), l.node));
    }
    repo.restore_from_head(&tracked)?;
    let gone: std::collections::HashSet<PathBuf> = left
        .iter()
        .filter(|(_, l)| !l.changed_before)
        .map(|(p, _)| p.clone())
        .collect();
    status.retain(|e| !gone.contains(&e.path));
    if !put_back.is_empty() {
        ctx.warn(format!(
            "left out of the commit, not the implementer's work (put back as they were): {}",
            put_back.join(", ")
        ));
    }
    if !kept.is_empty() {
        ctx.warn(format!(
            "changed after the implementer by another node, committed as they are now: {}",
            kept.join(", ")
        ));
    }
    Ok(())
}

/// Moves the loop's branch of the user's repository at `project` to the loop's.
fn publish(project: &Path, repo: &Repo, branch: &str) -> Result<(), GitError> {
    let checkout = Repo::checkout(project)?.ok_or_else(|| GitError::Failed {
        what: "rev-parse".into(),
        stderr: format!("{} is not a git repository any more", project.display()),
    })?;
    checkout.fetch_branch(&repo.git_dir, branch, false)
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// Why one changed path may not land; its `Display` is the path and the reason, as the
/// halt's detail lists them.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("{path}: {why}")]
    Radius { path: String, why: Refusal },
    #[error("{path}: is a nested git repository")]
    Nested { path: String },
    #[error("{path}: symlink target longer than {LINK_MAX} bytes")]
    LongLink { path: String },
    #[error("{path}: symlink target {why}")]
    LinkTarget { path: String, why: Refusal },
    #[error("{path}: {source}")]
    Unreadable { path: String, source: GitError },
}

fn joined(refused: &[Refused]) -> String {
    let lines: Vec<String> = refused.iter().map(ToString::to_string).collect();
    lines.join("; ")
}

/// One path of the staged tree against the radius: the path, a symlink's target as
/// committed (not as the disk has it now), and no nested repositories.
fn in_tree(radius: &Radius, repo: &Repo, c: &Change) -> Result<(), Refused> {
    let full = radius.root().join(&c.path);
    let path = || c.path.display().to_string();
    radius
        .check(&full)
        .map_err(|why| Refused::Radius { path: path(), why })?;
    if c.mode == MODE_GITLINK {
        return Err(Refused::Nested { path: path() });
    }
    if c.mode == MODE_SYMLINK {
        let target = repo
            .blob(&c.object, LINK_MAX + 1)
            .map_err(|source| Refused::Unreadable {
                path: path(),
                source,
            })?;
        if target.len() > LINK_MAX {
            return Err(Refused::LongLink { path: path() });
        }
        let target = crate::git::path_of(&target);
        let at = full.parent().unwrap_or(radius.root()).join(target);
        radius
            .check(&at)
            .map_err(|why| Refused::LinkTarget { path: path(), why })?;
    }
    Ok(())
}

/// One path changed on disk (worktrees off) against the radius, symlinks where they point.
fn on_disk(radius: &Radius, full: &Path) -> Result<(), Refused> {
    let path = || {
        full.strip_prefix(radius.root())
            .unwrap_or(full)
            .display()
            .to_string()
    };
    radius
        .check(full)
        .map_err(|why| Refused::Radius { path: path(), why })?;
    if full.join(".git").exists() {
        return Err(Refused::Nested { path: path() });
    }
    if std::fs::symlink_metadata(full).is_ok_and(|m| m.file_type().is_symlink())
        && let Ok(t) = std::fs::read_link(full)
    {
        let at = full.parent().unwrap_or(radius.root()).join(t);
        radius
            .check(&at)
            .map_err(|why| Refused::LinkTarget { path: path(), why })?;
    }
    Ok(())
}
