//! The integration tests: one binary (linked once) whose modules drive the real
//! `loopflow` executable through [`support`].

mod check;
mod color;
mod daemon;
mod dashboard;
mod exec;
mod halts;
mod isolation;
mod notify;
mod programs;
mod report;
mod review;
mod robustness;
mod schedule;
mod security;
mod support;
mod tick;
