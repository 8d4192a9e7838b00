//! A worktree loop's worktree made ready before a tick runs anything there: one of the old
//! layout moved to its place, a rewritten `.git` put back, the branch in step with the
//! user's repository.

use crate::state::{Event, LogArg, LoopPaths, StateError};

/// A worktree loop's worktree, as [`prepare`] left it.
pub(super) struct Ready {
    /// Where it stands (`None`: worktrees off).
    pub(super) place: Option<Result<crate::worktree::Place, crate::worktree::LocationError>>,
    /// Its repository, when it is there to use.
    pub(super) repo: Option<crate::git::Repo>,
    /// One of the old layout was moved to its place (the state says where now).
    pub(super) moved: bool,
}

/// A worktree loop's worktree, made ready before anything runs in it: one of the old
/// layout moved to its place (a dry run only says it would be), its `.git` pointed at the
/// loop's repository again when an agent rewrote it, its branch in step with the user's
/// repository.
pub(super) fn prepare(
    paths: &LoopPaths,
    config: &crate::config::LoopConfig,
    dry_run: bool,
) -> Result<Ready, StateError> {
    use crate::worktree::Place;
    let mut ready = Ready {
        place: None,
        repo: None,
        moved: false,
    };
    if !config.worktree {
        return Ok(ready);
    }
    let warn = |msg: String| paths.log(Event::Warn, &[LogArg::Kv("msg", msg)]);
    let mut place = crate::worktree::place(paths, config.worktree_dir.as_deref());
    if dry_run {
        ready.place = Some(place);
        return Ok(ready);
    }
    if let Ok(Place::Nested { old, new }) = &place {
        let allow: Vec<String> = config.allow.iter().map(|a| a.value.clone()).collect();
        place = Ok(match crate::worktree::migrate(paths, old, new, &allow) {
            Ok(_) => {
                ready.moved = true;
                Place::Own(new.clone())
            }
            Err(e) => {
                warn(format!(
                    "the worktree at {} could not be moved to {}: {e}; it stays where it is (`loopflow worktree restore --loop {}` tries again)",
                    old.display(),
                    new.work_tree.display(),
                    paths.name
                ))?;
                Place::Missing(new.clone())
            }
        });
    }
    let Ok(Place::Own(copy)) = &place else {
        ready.place = Some(place);
        return Ok(ready);
    };
    let repo = match copy.open() {
        Ok((repo, repaired)) => {
            if repaired {
                warn(format!(
                    "{}/.git named another repository (an agent rewrote it); it names the loop's own again",
                    copy.work_tree.display()
                ))?;
            }
            repo
        }
        Err(e) => {
            warn(format!("the loop's worktree cannot be used: {e}"))?;
            ready.place = Some(Ok(Place::Missing(copy.clone())));
            return Ok(ready);
        }
    };
    let allow: Vec<String> = config.allow.iter().map(|a| a.value.clone()).collect();
    if let Err(e) = repo.write_exclude(&crate::worktree::exclude_text(&allow)) {
        warn(format!("the loop's repository: {e}"))?;
    }
    if let Some(checkout) = crate::git::Repo::checkout(&paths.project).ok().flatten() {
        let moved = |what: &'static str, from: &str, to: &str| {
            paths.log(
                Event::Worktree,
                &[
                    LogArg::Kv(what, to.to_string()),
                    LogArg::Kv("from", from.to_string()),
                ],
            )
        };
        match crate::worktree::sync(&checkout, &repo, &copy.branch) {
            Ok(crate::worktree::Synced::InStep) => {}
            Ok(crate::worktree::Synced::Published { from, to }) => moved("published", &from, &to)?,
            Ok(crate::worktree::Synced::Followed { from, to }) => moved("followed", &from, &to)?,
            Err(why) => warn(why)?,
        }
    }
    ready.place = Some(place);
    ready.repo = Some(repo);
    Ok(ready)
}
