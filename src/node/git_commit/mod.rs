//! `git-commit`: commits the loop's changes in its worktree, after checking every changed,
//! added, deleted or renamed path against the blast radius. A violation halts the loop
//! as `human_intervention:blast_radius` and commits nothing.

use std::path::Path;

use crate::blast::Radius;
use crate::diag::Diagnostics;
use crate::git::{changed_paths, git, ok};
use crate::node::{Key, KeyType, NodeCtx, NodeKind, NodeOutput, NodeRun, NodeSpec};
use crate::reason::{Failure, HaltReason, Intervention};
use crate::template::Tmpl;
use crate::toml_read::Table;

pub struct GitCommit;

const DEFAULT_MESSAGE: &str = "loopflow {{loop}}: iteration {{iteration}}";

impl NodeKind for GitCommit {
    fn name(&self) -> &'static str {
        "git-commit"
    }
    fn about(&self) -> &'static str {
        "commits the worktree's changes, refusing any path outside the blast radius"
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

/// Checks that `cwd` is still the loop's own linked worktree on its own branch: not a
/// symlink (to the main checkout, say), not a `.git` file re-pointed at the main
/// repository, not switched to another branch. Otherwise a commit would land elsewhere.
fn own_worktree(cwd: &Path, name: &str) -> Result<(), String> {
    if std::fs::symlink_metadata(cwd).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err("the worktree is a symlink; refusing to commit where it points".into());
    }
    let out = ok(
        git(
            cwd,
            &[
                "rev-parse",
                "--path-format=absolute",
                "--show-toplevel",
                "--git-dir",
                "--git-common-dir",
                "--symbolic-full-name",
                "HEAD",
            ],
        )?,
        "rev-parse",
    )?;
    let text = String::from_utf8_lossy(&out);
    let lines: Vec<&str> = text.lines().collect();
    let [top, git_dir, common, head] = lines[..] else {
        return Err(format!("unexpected `git rev-parse` output: {text:?}"));
    };
    let same = |a: &str, b: &Path| std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok();
    if !same(top, cwd) {
        return Err(format!("git sees the working tree at {top}, not here"));
    }
    if same(git_dir, Path::new(common)) {
        return Err("this is the main checkout's git directory, not a linked worktree".into());
    }
    let branch = format!("refs/heads/loopflow/{name}");
    if head != branch {
        return Err(format!("HEAD is {head}, not {branch}"));
    }
    Ok(())
}

impl NodeSpec for GitCommitNode {
    fn templates(&self) -> Vec<&Tmpl> {
        self.message.iter().collect()
    }

    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun {
        let blast = HaltReason::HumanIntervention(Intervention::BlastRadius);
        let scope = ctx.scope();
        let cwd = scope.cwd;
        if ctx.config().worktree
            && let Err(why) = own_worktree(cwd, scope.loop_name)
        {
            return NodeRun::Halt {
                reason: blast,
                detail: Some(format!("{}: {why}", cwd.display())),
            };
        }
        let radius = match Radius::new(cwd, &ctx.config().allow, &ctx.config().deny) {
            Ok(r) => r,
            Err(e) => return NodeRun::fail(Failure::BlastRadius(e.to_string())),
        };
        let paths = match changed_paths(cwd) {
            Ok(p) => p,
            Err(e) => return NodeRun::fail(Failure::Git(e.to_string())),
        };
        let mut refused = Vec::new();
        for p in &paths {
            let full = radius.root().join(p);
            // A symlink is checked where it points, not where it sits.
            if let Err(why) = radius.check(&full) {
                refused.push(format!("{p}: {why}"));
            } else if full.join(".git").exists() {
                // `git add` would record a nested repository as a gitlink: not a file edit.
                refused.push(format!("{p}: is a nested git repository"));
            } else if std::fs::symlink_metadata(&full).is_ok_and(|m| m.file_type().is_symlink())
                && let Ok(target) = std::fs::read_link(&full)
            {
                let target = full.parent().unwrap_or(radius.root()).join(target);
                if let Err(why) = radius.check(&target) {
                    refused.push(format!("{p}: symlink target {why}"));
                }
            }
        }
        if !refused.is_empty() {
            return NodeRun::Halt {
                reason: blast,
                detail: Some(refused.join("; ")),
            };
        }
        if paths.is_empty() {
            return NodeRun::Ok(NodeOutput::default());
        }
        let message = match &self.message {
            Some(t) => ctx.render(&t.text),
            None => ctx.render(DEFAULT_MESSAGE),
        };
        let message = match message {
            Ok(m) => m,
            Err(e) => return NodeRun::fail(Failure::Template(e.to_string())),
        };
        let add = git(cwd, &["add", "-A", "--", "."]).and_then(|o| ok(o, "add"));
        if let Err(e) = add {
            return NodeRun::fail(Failure::Git(e.to_string()));
        }
        match git(
            cwd,
            &[
                "-c",
                "user.name=loopflow",
                "-c",
                "user.email=loopflow@localhost",
                "commit",
                "-q",
                "--no-verify",
                "-m",
                &message,
            ],
        )
        .and_then(|o| ok(o, "commit"))
        {
            Ok(_) => NodeRun::Ok(NodeOutput {
                exit_code: Some(0),
                output: Some(message),
                ..Default::default()
            }),
            Err(e) => NodeRun::fail(Failure::Git(e.to_string())),
        }
    }

    fn dry_run(&self, ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        let m = match &self.message {
            Some(t) => ctx.render(&t.text),
            None => ctx.render(DEFAULT_MESSAGE),
        }
        .map_err(|e| e.to_string())?;
        Ok(Some(format!(
            "would commit in {} with message {m:?}",
            ctx.scope().cwd.display()
        )))
    }
}
