//! `loopflow drift`: docs whose recorded last-read commit is older than the last change to
//! the code they describe, one JSON line each (`{"id", "title"}`), so an audit work source
//! (the design-update template) reads them as tasks. `--check` makes drift fail CI: exit 1
//! when any doc drifted.

use std::path::PathBuf;

use clap::Args;

use crate::exit;
use crate::out::outln;

#[derive(Args, Debug)]
pub(crate) struct DriftArgs {
    /// Directories (relative to --repo) searched for markdown docs with a `describes:`
    /// marker. Repeatable.
    #[arg(long = "dir", value_name = "DIR", default_values_t = ["design".to_string(), "docs".to_string()])]
    pub dirs: Vec<String>,
    /// The git working tree to inspect (default: the current directory, which is the
    /// loop's worktree when an audit runs it; --project is not used).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub repo: PathBuf,
    /// Exit 1 when any doc drifted, 0 when none did (for CI); the same lines are printed.
    #[arg(long)]
    pub check: bool,
}

pub(super) fn drift(a: DriftArgs) -> i32 {
    match crate::drift::find(&a.repo, &a.dirs) {
        Ok(found) => {
            for d in &found {
                outln!("{}", d.task_json());
            }
            if a.check && !found.is_empty() {
                eprintln!(
                    "error: {} doc(s) drifted from the code they describe; update each and its `last-read-sha`",
                    found.len()
                );
                return exit::NO;
            }
            exit::OK
        }
        Err(e) => {
            eprintln!("error: {e}\n  drift compares git history; run it inside a git working tree");
            exit::USAGE
        }
    }
}
