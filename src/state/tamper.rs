//! Noticing changes made by someone other than loopflow during a tick: fields of
//! `.state.loop` that only a tick's own commit (or `approve`, refused while a tick runs)
//! may change, and the files that steer the loop (`loop.toml`, the pipeline, prompts).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use super::State;

/// Fields of `.state.loop` that only a tick's own commit or `approve` may change. `approve`
/// is refused while a tick holds the lock, so at commit time they must still hold their
/// tick-start values; a difference means something with write access to the file (an
/// agent) rewrote it. `halt` may be set during a tick (`loopflow halt`), never cleared;
/// `current_phase` may change (`loopflow transition`).
pub(crate) fn forged_fields(start: &State, disk: &State) -> Vec<&'static str> {
    let mut f = Vec::new();
    let mut check = |changed: bool, name: &'static str| {
        if changed {
            f.push(name);
        }
    };
    check(
        disk.schema_version != start.schema_version,
        "schema_version",
    );
    check(disk.name != start.name, "name");
    check(
        disk.iteration_count != start.iteration_count,
        "iteration_count",
    );
    check(
        disk.extra_iterations != start.extra_iterations,
        "extra_iterations",
    );
    check(disk.extra_budget != start.extra_budget, "extra_budget");
    check(disk.approvals != start.approvals, "approvals");
    check(disk.score_history != start.score_history, "score_history");
    check(disk.spent != start.spent, "spent");
    check(disk.last_verdict != start.last_verdict, "last_verdict");
    check(disk.last_tick_at != start.last_tick_at, "last_tick_at");
    check(
        disk.consecutive_aborts != start.consecutive_aborts,
        "consecutive_aborts",
    );
    check(disk.current_task != start.current_task, "current_task");
    check(disk.task_source != start.task_source, "task_source");
    check(disk.worktree_path != start.worktree_path, "worktree_path");
    check(disk.created_at != start.created_at, "created_at");
    check(disk.last_abort != start.last_abort, "last_abort");
    check(start.halt.is_some() && disk.halt != start.halt, "halt");
    f
}

/// The files that steer a tick, each with a digest of its contents when the tick began.
#[derive(Debug, Clone, Default)]
pub(crate) struct Watched(Vec<(PathBuf, u64)>);

impl Watched {
    /// Digests `files` (duplicates once), taking the digest of a file from `known` (of
    /// its bytes as the tick just read them) instead of reading it again.
    pub(crate) fn with_known(
        files: impl IntoIterator<Item = PathBuf>,
        known: &[(PathBuf, u64)],
    ) -> Watched {
        let mut files: Vec<PathBuf> = files.into_iter().collect();
        files.dedup();
        Watched(
            files
                .into_iter()
                .map(|f| {
                    let d = known
                        .iter()
                        .find(|(k, _)| *k == f)
                        .map_or_else(|| digest(&f), |(_, d)| *d);
                    (f, d)
                })
                .collect(),
        )
    }

    /// The watched files whose contents changed since [`Watched::with_known`].
    pub(crate) fn changed(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|(f, d)| digest(f) != *d)
            .map(|(f, _)| f.display().to_string())
            .collect()
    }
}

fn digest(path: &Path) -> u64 {
    match crate::fs_safe::head(path, crate::fs_safe::TEXT_MAX + 1) {
        Ok(bytes) => digest_bytes(&bytes),
        Err(e) => {
            let mut h = std::hash::DefaultHasher::new();
            e.kind().to_string().hash(&mut h);
            h.finish()
        }
    }
}

/// The digest of a watched file's contents.
pub(crate) fn digest_bytes(bytes: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}
