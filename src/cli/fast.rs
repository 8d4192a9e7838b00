//! The command line a scheduler fires every tick — `run --loop X` with `--project DIR`,
//! `--json`, `--dry-run`, `--parallel` in any order — read without clap: building clap's
//! command tree for every subcommand costs ~360,000 instructions, 15% of a whole tick.
//! Only argument lists whose meaning is beyond doubt are taken (each flag once, values
//! that cannot be mistaken for flags, `LOOPFLOW_PROJECT` unset or overridden); everything
//! else, help and errors included, goes to clap. A unit test holds the two readings equal.

use std::ffi::OsString;
use std::path::PathBuf;

use super::run::RunArgs;
use super::{Cli, Command};

/// `Some` when `args` (without the program name) is a plain `run` invocation.
pub(super) fn parse(args: impl Iterator<Item = OsString>) -> Option<Cli> {
    let mut args = args.map(|a| a.into_string().ok());
    let (mut run, mut project, mut name, mut slot) = (false, None, None, None);
    let (mut json, mut dry_run, mut parallel) = (false, false, false);
    let value = |v: Option<String>| v.filter(|v| !v.is_empty() && !v.starts_with('-'));
    while let Some(a) = args.next() {
        let a = a?;
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a, None),
        };
        let set = |slot: &mut bool| (!std::mem::replace(slot, true)).then_some(());
        match flag.as_str() {
            "run" if inline.is_none() => set(&mut run)?,
            "--loop" if name.is_none() => name = Some(value(inline.or_else(|| args.next()?))?),
            "--project" if project.is_none() => {
                project = Some(PathBuf::from(value(inline.or_else(|| args.next()?))?));
            }
            "--slot" if slot.is_none() && run => {
                slot = Some(value(inline.or_else(|| args.next()?))?);
            }
            "--json" if inline.is_none() && run => set(&mut json)?,
            "--dry-run" if inline.is_none() && run => set(&mut dry_run)?,
            "--parallel" if inline.is_none() && run => set(&mut parallel)?,
            _ => return None,
        }
        // Subcommand flags before the subcommand are clap's to refuse.
        if !run && name.is_some() {
            return None;
        }
    }
    // Without `--project`, clap would read `LOOPFLOW_PROJECT`: leave that to it.
    if !run || (project.is_none() && std::env::var_os("LOOPFLOW_PROJECT").is_some()) {
        return None;
    }
    // Without `--slot`, `LOOPFLOW_SLOT` as clap reads it (the daemon sets it).
    if slot.is_none() {
        match std::env::var_os("LOOPFLOW_SLOT").map(|v| v.into_string()) {
            None => {}
            Some(Ok(v)) if !v.is_empty() => slot = Some(v),
            Some(_) => return None,
        }
    }
    Some(Cli {
        project: project.into_iter().collect(),
        command: Command::Run(RunArgs {
            pipeline: None,
            loop_name: name?,
            json,
            dry_run,
            parallel,
            slot,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn fast(args: &[&str]) -> Option<String> {
        parse(args.iter().map(OsString::from)).map(|c| format!("{c:?}"))
    }

    fn clap(args: &[&str]) -> Option<String> {
        Cli::try_parse_from(std::iter::once("loopflow").chain(args.iter().copied()))
            .ok()
            .map(|c| format!("{c:?}"))
    }

    #[test]
    fn reads_what_clap_reads_or_leaves_it_to_clap() {
        let env_set = std::env::var_os("LOOPFLOW_PROJECT").is_some();
        let taken = [
            &["run", "--loop", "a"][..],
            &["run", "--loop", "a", "--project", "/p"],
            &["--project", "/p", "run", "--loop", "a"],
            &["run", "--loop=a", "--project=/p dir", "--json"],
            &[
                "run",
                "--json",
                "--dry-run",
                "--parallel",
                "--loop",
                "x_1",
                "--project",
                "rel",
            ],
            &["run", "--parallel", "--project", "/p", "--loop", "a"],
            &["run", "--loop", "a", "--slot", "2026-12-07T10:23Z"],
            &["run", "--slot=auto", "--loop", "a", "--project", "/p"],
        ];
        for args in taken {
            let f = fast(args);
            if !env_set || args.iter().any(|a| a.starts_with("--project")) {
                assert!(f.is_some(), "{args:?} should take the fast path");
            }
            if f.is_some() {
                assert_eq!(f, clap(args), "{args:?}");
            }
        }
        let left_to_clap = [
            &["run"][..],
            &["run", "--help"],
            &["--help"],
            &["--version"],
            &["run", "--loop"],
            &["run", "--loop", "--json"],
            &["run", "--loop", "-x"],
            &["run", "--loop=-x"],
            &["run", "--loop", ""],
            &["run", "--loop", "a", "--loop", "b"],
            &["run", "--loop", "a", "--json", "--json"],
            &["run", "--loop", "a", "--json=true"],
            &["run", "--loop", "a", "pipelines/x.toml"],
            &["run", "--loop", "a", "--"],
            &["run", "run", "--loop", "a"],
            &["--loop", "a", "run"],
            &["--json", "run", "--loop", "a"],
            &["status"],
            &["status", "--loop", "a"],
            &["run", "--loop", "a", "--project"],
            &["run", "--loop", "a", "--project", "-p"],
            &["run", "--lop", "a"],
            &["run", "-h"],
            &["run", "--loop", "a", "--slot"],
            &["run", "--loop", "a", "--slot", "x", "--slot", "y"],
        ];
        for args in left_to_clap {
            assert_eq!(fast(args), None, "{args:?}");
        }
    }
}
