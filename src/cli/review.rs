//! `review`, `land` and `discard`: a human looks at what a loop did, then takes it home or
//! throws it away. Data on stdout (`--json`: one document), progress on stderr.

use std::path::Path;

use clap::Args;

use super::open;
use crate::exit;
use crate::land::{LandError, land as land_loop};
use crate::remote::human::Guard;

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  loopflow review --loop docs\n  loopflow review --loop docs --patch | less -R\n  loopflow review --loop docs --json | jq .files"
)]
pub(crate) struct ReviewArgs {
    /// The loop to review.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Include the full diff (and the worktree's uncommitted changes).
    #[arg(long)]
    pub patch: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Merges loopflow/NAME into the branch the checkout is on (a merge commit; --squash makes one \
plain commit and moves loopflow/NAME onto it). Refused, with nothing changed, while a tick runs, when tracked files \
have uncommitted changes, or when the merge would conflict.\n\nExamples:\n  loopflow review --loop docs && loopflow land --loop docs\n  loopflow land --loop docs --squash"
)]
pub(crate) struct LandArgs {
    /// The loop whose branch to merge.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// One commit holding all of the loop's work instead of a merge commit.
    #[arg(long)]
    pub squash: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Resets loopflow/NAME and its worktree to the checkout's HEAD: the loop's commits and \
uncommitted files are dropped (git-ignored files stay). Without --yes it only says what it would do.\n\nExample:\n  loopflow discard --loop docs --yes"
)]
pub(crate) struct DiscardArgs {
    /// The loop whose work to drop.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Really do it.
    #[arg(long)]
    pub yes: bool,
}

/// Writes to stdout through [`crate::out::write`]: a closed pipe ends the command
/// quietly, any other write error makes the exit code STATE.
fn out(text: &str) -> i32 {
    crate::out::write(text.as_bytes());
    exit::OK
}

pub(super) fn review(project: &Path, a: ReviewArgs) -> i32 {
    let (paths, state) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    // The branch as the remote has it, for a remote loop.
    if let Err(code) = super::remote::refresh(&paths, true) {
        return code;
    }
    let r = match crate::review::review(&paths, &state, a.patch) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: refused: {}", crate::out::printable(&e));
            return exit::NO;
        }
    };
    if a.json {
        let doc = crate::out::json(&crate::review::to_json(&r), true);
        return out(&format!("{doc}\n"));
    }
    let mut text = crate::review::render(&r);
    if let Some(p) = &r.patch {
        text.push('\n');
        text.push_str(&crate::out::printable_text(p));
    }
    out(&text)
}

fn refused(e: &LandError) -> i32 {
    eprintln!("error: {e}");
    match e {
        LandError::State(_) | LandError::Git(_) => exit::STATE,
        LandError::NotGit(_) | LandError::NoBranch(..) => exit::USAGE,
        _ => exit::NO,
    }
}

pub(super) fn land(project: &Path, a: LandArgs) -> i32 {
    let (paths, state) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    let landed = super::remote::write(&paths, Guard::RefuseLease, true, || {
        land_loop(&paths, &state, a.squash)
    });
    match landed {
        Err(code) => code,
        Ok(Err(e)) => refused(&e),
        Ok(Ok(l)) if l.head.is_none() => {
            eprintln!(
                "nothing to land: {} has no commits that are not on {}",
                crate::review::branch(&a.loop_name),
                l.into
            );
            exit::OK
        }
        Ok(Ok(l)) => {
            eprintln!(
                "landed {} commit(s) of {} into {}{}",
                l.commits,
                crate::review::branch(&a.loop_name),
                l.into,
                if a.squash { " as one commit" } else { "" }
            );
            if let Some(n) = &l.note {
                eprintln!("note: {n}");
            }
            out(&format!("{}\n", l.head.unwrap_or_default()))
        }
    }
}

pub(super) fn discard(project: &Path, a: DiscardArgs) -> i32 {
    let (paths, state) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    let discarded = super::remote::write(&paths, Guard::RefuseLease, true, || {
        crate::land::discard(&paths, &state, a.yes)
    });
    match discarded {
        Err(code) => code,
        Ok(Err(e)) => refused(&e),
        Ok(Ok(d)) => {
            let short = &d.to[..d.to.len().min(10)];
            let what = format!(
                "{} commit(s) on {} and {} uncommitted file(s){}",
                d.commits,
                d.branch,
                d.uncommitted.len(),
                d.worktree
                    .as_ref()
                    .map(|w| format!(" in {}", w.display()))
                    .unwrap_or_default()
            );
            if d.done {
                eprintln!("discarded {what}; {} is now at {short}", d.branch);
                exit::OK
            } else {
                eprintln!(
                    "would discard {what}, resetting {} to the checkout's HEAD {short}",
                    d.branch
                );
                for u in &d.uncommitted {
                    eprintln!("  {}", crate::out::printable(u));
                }
                eprintln!("nothing was changed; run again with --yes to do it");
                exit::NO
            }
        }
    }
}
