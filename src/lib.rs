//! loopflow: runs AI coding-agent work unattended, in capped iterations, with a mandatory
//! human approval at every halt. The binary (`main.rs`) only parses arguments and maps
//! the library's results to exit codes.

pub mod blast;
pub mod brakes;
pub mod cli;
pub mod config;
pub mod create;
pub mod diag;
pub mod drift;
pub mod duration;
pub mod exec;
pub mod exit;
pub mod fs_safe;
pub mod git;
pub mod lifecycle;
pub mod load;
pub mod node;
pub mod pipeline;
pub mod preset;
pub mod process;
pub mod reason;
pub mod schedule;
pub mod schema;
pub mod state;
pub mod template;
pub mod tick;
pub mod toml_read;
pub mod verdict;
pub mod work_source;
pub mod worktree;
