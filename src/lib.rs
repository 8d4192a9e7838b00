//! loopflow: runs AI coding-agent work unattended, in capped iterations, with a mandatory
//! human approval at every halt. The binary (`main.rs`) only parses arguments and maps
//! the library's results to exit codes.

pub mod blast;
pub mod brakes;
pub mod cli;
pub mod config;
pub mod demo;
pub mod diag;
pub mod drift;
pub mod exec;
pub mod exit;
pub mod fs_safe;
pub mod git;
pub mod graph;
pub mod node;
pub mod pipeline;
pub mod preset;
pub mod process;
pub mod project;
pub mod schedule;
pub mod schema;
pub mod state;
pub mod template;
pub mod toml_read;
pub mod verdict;
pub mod worktree;
