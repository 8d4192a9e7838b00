//! loopflow: runs AI coding-agent work unattended, in capped iterations, with a mandatory
//! human approval at every halt. The binary (`main.rs`) only calls [`main`] and exits with
//! its code.
//!
//! How a tick reads, top-down: `cli::run` → `tick` (open, lock, recover, load, gate, walk,
//! settle) → `exec` (the DAG walk) → `node::*` (one file per node kind) → `lifecycle`
//! (commit, halts, approvals, the schedule). Below them: `load` (loop.toml + pipeline +
//! cross-checks) over `config`, `pipeline`, `preset`; `brakes` and `work_source`; and the
//! leaves `state`, `process`, `git`, `template`, `toml_read`, `fs_safe`, `diag`.
//! `scripts/modgraph.py` checks that no two modules import each other.

mod announce;
mod blast;
mod brakes;
mod cli;
mod config;
mod create;
mod dashboard;
mod diag;
mod drift;
mod duration;
mod environ;
mod exec;
mod exit;
mod explain;
mod fs_safe;
mod git;
mod human;
mod land;
mod lifecycle;
mod load;
mod next;
mod node;
mod notify;
mod out;
mod pipeline;
mod preset;
mod process;
mod projects;
mod reason;
mod remote;
mod review;
mod row;
mod sandbox;
mod schedule;
mod schema;
mod state;
mod telemetry;
mod template;
mod tick;
mod toml_read;
mod verdict;
mod work_source;
mod worktree;

pub use cli::main;

/// What the integration tests and benchmarks reach for besides the binary. Not an API:
/// it changes whenever they do.
#[doc(hidden)]
pub mod testing {
    pub use crate::create::{CreateOptions, create};
    pub use crate::diag::{Code, Diagnostics, Source};
    pub use crate::fs_safe::write_atomic;
    pub use crate::node::{COMMON_KEYS, REGISTRY, kind_names};
    pub use crate::pipeline::Pipeline;
    pub use crate::schema::get as schema;
    pub use crate::state::{LoopPaths, load, save};
    pub use crate::template::vars::{ALWAYS, NODE_FIELDS, SOURCE, names as template_names};
    pub use crate::tick::{RunOptions, run_tick};
}
