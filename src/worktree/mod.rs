//! A loop's worktree: a repository of its own, outside the checkout, on the loop's branch
//! (`loopflow/<name>`). Outside, because every tool that searches parent directories
//! (cargo's workspace root, uv and npm workspaces, pytest's rootdir, node's
//! `node_modules`) must find the loop's copy and not the user's checkout — and under the
//! read sandbox, fail on it. A repository of its own (not a linked worktree of the
//! user's), because its agents may read its objects: only the branch's history is there,
//! never a stash or an unreachable `.env`. Its git directory sits beside the work tree,
//! loopflow's to write (see `git::copy`).
//!
//! Where: `<root>/<project label>-<hash of the project path>/<name>/` (the work tree) and
//! `<name>.git/` beside it, `<root>` being `[worktree] dir` or
//! `$XDG_STATE_HOME/loopflow/worktrees` (else `~/.local/state/…`). The place is derived,
//! never read from the state: a copied or moved project has worktrees of its own.
//! It is a disposable copy: everything of record is the branch and the state.

mod gc;
mod make;

use std::path::{Path, PathBuf};

use crate::git::{CopyError, Repo};
use crate::state::LoopPaths;

pub(crate) use gc::{GcOptions, gc};
pub(crate) use make::{
    RestoreError, Synced, create, exclude_text, migrate, remove, restore, restore_held, sync,
};

/// Where a loop's worktree is, on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    /// Where agents work (`{{cwd}}`).
    pub work_tree: PathBuf,
    /// Its git directory, beside the work tree: loopflow's own.
    pub git_dir: PathBuf,
    /// `refs/heads/loopflow/<name>`.
    pub branch: String,
    pub name: String,
}

impl Copy {
    /// The repository, checked to be what loopflow made (its `.git` file put back when
    /// an agent rewrote it: the second value).
    pub fn open(&self) -> Result<(Repo, bool), CopyError> {
        Repo::open_copy(&self.git_dir, &self.work_tree, &self.branch, &self.name)
    }

    /// Whether both directories are there (two `stat`s; what `open` checks is left to it).
    pub fn exists(&self) -> bool {
        let real_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
        real_dir(&self.work_tree) && self.git_dir.join("HEAD").is_file()
    }
}

/// The loop's branch, fully named.
pub(crate) fn branch_ref(name: &str) -> String {
    format!("refs/heads/loopflow/{name}")
}

/// Why a worktree has no place on this machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LocationError {
    #[error(
        "no place for loop worktrees: neither XDG_STATE_HOME nor HOME is set (set one, or `[worktree] dir` in loop.toml)"
    )]
    NoHome,
    #[error(
        "loop worktrees would live under {}, inside the project {}: tools that search parent directories would find the checkout (set XDG_STATE_HOME or `[worktree] dir` to a directory outside it)",
        root.display(),
        project.display()
    )]
    Inside { root: PathBuf, project: PathBuf },
}

/// The directory worktrees live under: `[worktree] dir`, else
/// `$XDG_STATE_HOME/loopflow/worktrees`, else `~/.local/state/loopflow/worktrees`.
fn root(dir: Option<&Path>) -> Result<PathBuf, LocationError> {
    match dir {
        Some(d) => Ok(d.to_path_buf()),
        None => crate::state::machine::base()
            .map(|b| b.join("worktrees"))
            .ok_or(LocationError::NoHome),
    }
}

use crate::state::machine::real;

/// The directory of this project's worktrees: `<root>/<label>-<hash>`, the label the
/// project directory's name (so a person can tell them apart), the hash its full path's.
pub(crate) fn project_root(project: &Path, dir: Option<&Path>) -> Result<PathBuf, LocationError> {
    let root = root(dir)?;
    let project = real(project);
    if real(&root).starts_with(&project) {
        return Err(LocationError::Inside { root, project });
    }
    Ok(root.join(crate::state::machine::project_key(&project)))
}

/// Where loop `name` of `project` has its worktree on this machine.
pub(crate) fn location(
    project: &Path,
    name: &str,
    dir: Option<&Path>,
) -> Result<Copy, LocationError> {
    let base = project_root(project, dir)?;
    Ok(Copy {
        work_tree: base.join(name),
        git_dir: base.join(format!("{name}.git")),
        branch: branch_ref(name),
        name: name.to_string(),
    })
}

/// The worktree of the old layout, inside the loop's own directory.
pub(crate) fn nested(paths: &LoopPaths) -> PathBuf {
    paths.dir.join("worktree")
}

/// Where a loop's worktree stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// There, at its place.
    Own(Copy),
    /// Not there: removed, or never made on this machine (`worktree restore` makes it).
    Missing(Copy),
    /// Still in the old layout, inside the checkout (`.loopflow/loops/<name>/worktree`):
    /// moved to its place by `worktree restore` or the next tick.
    Nested { old: PathBuf, new: Copy },
}

impl Place {
    pub(crate) fn copy(&self) -> &Copy {
        match self {
            Place::Own(c) | Place::Missing(c) | Place::Nested { new: c, .. } => c,
        }
    }
}

/// Where loop `paths.name`'s worktree stands: a few `stat`s, no git.
pub(crate) fn place(paths: &LoopPaths, dir: Option<&Path>) -> Result<Place, LocationError> {
    let copy = location(&paths.project, &paths.name, dir)?;
    if copy.exists() {
        return Ok(Place::Own(copy));
    }
    let old = nested(paths);
    if std::fs::symlink_metadata(old.join(".git")).is_ok() {
        return Ok(Place::Nested { old, new: copy });
    }
    Ok(Place::Missing(copy))
}

/// The loop's worktree for a command that reads or changes it (`review`, `land`,
/// `discard`): its place, whether it is there or not.
pub(crate) fn checked(paths: &LoopPaths, dir: Option<&Path>) -> Result<Copy, String> {
    let state = paths.load().map_err(|e| e.to_string())?;
    paths.owns(&state).map_err(|e| e.to_string())?;
    place(paths, dir)
        .map(|p| p.copy().clone())
        .map_err(|e| e.to_string())
}

/// The file in a loop's git directory that names the project it belongs to.
const PROJECT_MARK: &str = "loopflow-project";

/// Marks a loop's repository with the project it belongs to (for [`project_of`]).
pub(crate) fn mark(copy: &Copy, project: &Path) -> std::io::Result<()> {
    let text = format!("{}\n", real(project).display());
    crate::fs_safe::write_atomic(
        &copy.git_dir,
        &copy.git_dir.join(PROJECT_MARK),
        text.as_bytes(),
    )
}

/// The project whose loop worktree `dir` is in (a human running `loopflow review` there),
/// checked: the project's worktree of that loop is this very directory. `None` anywhere
/// else.
pub(crate) fn project_of(dir: &Path) -> Option<PathBuf> {
    let top = dir
        .ancestors()
        .find(|d| std::fs::symlink_metadata(d.join(".git")).is_ok_and(|m| m.is_file()))?;
    let text = crate::fs_safe::head(&top.join(".git"), 4096).ok()?;
    let git_dir = PathBuf::from(
        std::str::from_utf8(&text)
            .ok()?
            .trim_end()
            .strip_prefix("gitdir: ")?,
    );
    let name = git_dir
        .file_name()?
        .to_str()?
        .strip_suffix(".git")?
        .to_string();
    let mark = crate::fs_safe::head(&git_dir.join(PROJECT_MARK), 4096).ok()?;
    let project = PathBuf::from(std::str::from_utf8(&mark).ok()?.trim_end());
    let paths = LoopPaths::new(&project, &name);
    let dir = configured_dir(&paths);
    let copy = location(&project, &name, dir.as_deref()).ok()?;
    (real(&copy.work_tree) == real(top) && real(&copy.git_dir) == real(&git_dir)).then_some(project)
}

/// `[worktree] dir` of a loop, read from its `loop.toml` (`None`: the default place, or a
/// loop.toml that does not read — its commands say so themselves).
pub(crate) fn configured_dir(paths: &LoopPaths) -> Option<PathBuf> {
    let mut d = crate::diag::Diagnostics::default();
    crate::config::LoopConfig::read_partial(&paths.config(), &paths.project, &mut d)
        .ok()
        .flatten()
        .and_then(|p| p.config.worktree_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worktrees_live_outside_the_project_under_a_name_people_can_read() {
        let home = tempfile::tempdir().unwrap();
        let project = home.path().join("my project");
        std::fs::create_dir_all(&project).unwrap();
        let dir = home.path().join("loops");
        let c = location(&project, "fix", Some(&dir)).unwrap();
        let base = c.work_tree.parent().unwrap();
        assert_eq!(base.parent().unwrap(), dir);
        let label = base.file_name().unwrap().to_string_lossy().into_owned();
        assert!(label.starts_with("my_project-"), "{label}");
        assert_eq!(label.len(), "my_project-".len() + 12);
        assert_eq!(c.work_tree.file_name().unwrap(), "fix");
        assert_eq!(c.git_dir, base.join("fix.git"));
        assert_eq!(c.branch, "refs/heads/loopflow/fix");
        // Another project, another place; the same one, the same place.
        let other = home.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        assert_ne!(location(&other, "fix", Some(&dir)).unwrap(), c);
        assert_eq!(location(&project, "fix", Some(&dir)).unwrap(), c);
        // Never inside the project.
        let inside = project.join("wt");
        assert!(matches!(
            location(&project, "fix", Some(&inside)),
            Err(LocationError::Inside { .. })
        ));
    }
}
