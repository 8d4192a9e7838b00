//! The integration tests: one binary (linked once) whose modules drive the real
//! `loopflow` executable through [`support`].

mod cache_spend;
mod check;
mod check_all;
mod cli;
mod color;
mod daemon;
mod drift;
mod exec;
mod halts;
mod isolation;
mod programs;
mod report;
mod robustness;
mod sarif;
mod schedule;
mod schedule_files;
mod security;
mod support;
mod tick;
mod worktree;
