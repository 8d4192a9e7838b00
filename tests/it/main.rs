//! The integration tests: one binary (linked once) whose modules drive the real
//! `loopflow` executable through [`support`].

// Test and benchmark code prints its reports, unwraps what must be there, reaches
// libc for counters, and shares helpers between its own modules: the library's lints
// (`[lints]` in Cargo.toml) are for the product.
#![allow(
    unreachable_pub,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::undocumented_unsafe_blocks
)]

mod agent_failures;
mod agent_state;
mod agents;
mod book;
mod cache_spend;
mod check;
mod check_all;
mod cli;
mod color;
mod contract;
mod create_agent;
mod daemon;
mod daemon_wakes;
mod dashboard;
mod distribution;
mod doctor;
mod dogfood;
mod drift;
mod exec;
mod git_escape;
mod git_versions;
mod halts;
mod harness_limits;
mod human_verbs;
mod isolation;
mod no_way_out;
mod notify;
mod programs;
mod projects;
mod remote;
mod report;
mod review;
mod robustness;
mod sandbox;
mod sarif;
mod schedule;
mod schedule_files;
mod secrets;
mod security;
mod status_probe;
mod support;
mod telemetry;
mod tick;
mod toolchains;
mod work;
mod worktree;
