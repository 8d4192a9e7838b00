//! The integration tests: one binary (linked once) whose modules drive the real
//! `loopflow` executable through [`support`].

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
mod dogfood;
mod drift;
mod exec;
mod git_versions;
mod halts;
mod harness_limits;
mod isolation;
mod notify;
mod programs;
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
mod tick;
mod worktree;
