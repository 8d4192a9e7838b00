//! The executor through a fake [`Host`]: no process, no file, no clock to wait for. Each
//! node's spawns are scripted exit by exit; the host records what the walk asked of it.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::*;
use crate::brakes::{GateReport, GateVerdict};
use crate::config::LoopConfig;
use crate::diag::{Diagnostics, Source};
use crate::lifecycle::{Committed, Delta};
use crate::node::Spawn;
use crate::process::{Exit, Finished};
use crate::reason::Budget;
use crate::state::{Event, LogArg, LoopPaths, StateError};
use crate::template::vars;
use crate::work_source::WorkSourceReader;

/// A host that runs nothing: each node's spawns end as scripted, in turn (exit 0 once a
/// node's script runs out).
#[derive(Default)]
struct Fake {
    exits: Mutex<HashMap<String, VecDeque<Exit>>>,
    /// Every spawn: node id and the timeout it was given.
    spawns: Mutex<Vec<(String, Option<Duration>)>>,
    /// Every `RETRY` event: node, attempt, reason.
    retries: Mutex<Vec<(String, String, String)>>,
    /// Every commit: the spend it carried.
    commits: Mutex<Vec<f64>>,
    settled: AtomicUsize,
    cancel: AtomicBool,
    /// A SIGTERM arriving while this node's process runs.
    cancel_in: Option<&'static str>,
    /// `before_node` calls so far, and the call (counted from 1) that is stopped.
    befores: AtomicUsize,
    stop_at: Option<(usize, Stop)>,
    /// This node's spawn panics.
    panic_in: Option<&'static str>,
    /// These nodes' spawns wait for one another (up to 5 s): whether all of them met.
    meet: Option<(&'static [&'static str], Mutex<usize>, Condvar)>,
    met: AtomicBool,
}

impl Fake {
    fn new(script: &[(&str, &[Exit])]) -> Fake {
        let exits = script
            .iter()
            .map(|(id, e)| (id.to_string(), e.iter().cloned().collect()))
            .collect();
        Fake {
            exits: Mutex::new(exits),
            ..Fake::default()
        }
    }

    fn spawned(&self) -> Vec<String> {
        let s = self.spawns.lock().unwrap();
        s.iter().map(|(id, _)| id.clone()).collect()
    }

    fn retried(&self) -> Vec<(String, String, String)> {
        self.retries.lock().unwrap().clone()
    }

    fn rendezvous(&self, node: &str) {
        let Some((nodes, count, cv)) = &self.meet else {
            return;
        };
        if !nodes.contains(&node) {
            return;
        }
        let mut n = count.lock().unwrap();
        *n += 1;
        cv.notify_all();
        let (n, _) = cv
            .wait_timeout_while(n, Duration::from_secs(5), |n| *n < nodes.len())
            .unwrap();
        if *n == nodes.len() {
            self.met.store(true, Ordering::SeqCst);
        }
    }
}

impl Host for Fake {
    fn spawn(&self, node: &str, spawn: &Spawn<'_>) -> Finished {
        self.spawns
            .lock()
            .unwrap()
            .push((node.to_string(), spawn.timeout));
        assert!(self.panic_in != Some(node), "the host failed inside {node}");
        self.rendezvous(node);
        if self.cancel_in == Some(node) {
            self.cancel.store(true, Ordering::SeqCst);
        }
        let exit = self
            .exits
            .lock()
            .unwrap()
            .get_mut(node)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Exit::Code(0));
        Finished {
            exit,
            elapsed: Duration::from_millis(250),
        }
    }

    fn event(&self, event: Event, args: &[LogArg<'_>]) {
        if event != Event::Retry {
            return;
        }
        let kv = |k: &str| {
            args.iter()
                .find_map(|a| match a {
                    LogArg::Kv(key, v) if *key == k => Some(v.clone()),
                    _ => None,
                })
                .unwrap_or_default()
        };
        self.retries
            .lock()
            .unwrap()
            .push((kv("node"), kv("attempt"), kv("reason")));
    }

    fn commit(&self, delta: Delta) -> Result<Committed, StateError> {
        self.commits.lock().unwrap().push(delta.seconds);
        let mut state = State::new("l", Some("t".into()), None);
        state.iteration_count = 1;
        Ok(Committed {
            state,
            halted: None,
            announce: None,
        })
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    fn before_node(&self, _spawns: bool) -> Result<(), Stop> {
        let n = self.befores.fetch_add(1, Ordering::SeqCst) + 1;
        match &self.stop_at {
            Some((at, stop)) if *at == n => Err(stop.clone()),
            _ => Ok(()),
        }
    }

    fn settled(&self, _out: &NodeOutput) {
        self.settled.fetch_add(1, Ordering::SeqCst);
    }
}

/// Hands `f` a scope for tick 1 of loop `l`, whose gate said `verdict`. Nothing in it
/// exists on disk: a node that reads a file finds nothing.
fn with_scope<R>(verdict: GateVerdict, f: impl FnOnce(&TickScope<'_>) -> R) -> R {
    let project = Path::new("/nonexistent/loopflow-exec-tests");
    let src = Source::new("loop.toml", "loop.toml", "[brakes]\nmax_iterations = 5\n");
    let mut d = Diagnostics::default();
    let config = LoopConfig::parse(&src, project, &mut d).expect("a minimal loop.toml");
    let state = State::new("l", Some("t".into()), None);
    let paths = LoopPaths::new(project, "l");
    let work = WorkSourceReader::new(&config, &state, &paths, true);
    let gate = GateReport {
        ok: matches!(verdict, GateVerdict::Pass),
        reason: None,
        checks: Vec::new(),
        verdict,
        task: None,
        work_unreadable: None,
    };
    let hb = crate::template::engine();
    let vars = vars::tick(&vars::Tick {
        loop_name: "l",
        project: "/nonexistent/loopflow-exec-tests",
        iteration: 1,
        cwd: "/nonexistent/loopflow-exec-tests",
        current_task: "t",
        task_title: "t",
        current_phase: "implement",
        reasons: &[],
        next_hint: "",
    });
    let outputs = paths.outputs.clone();
    let scope = TickScope {
        loop_name: "l",
        project,
        outputs: &outputs,
        output_dir: &outputs,
        cache_dir: &outputs,
        baseline: None,
        config: &config,
        prompts: &[],
        state: &state,
        tick: 1,
        cwd: project,
        gate: &gate,
        work: &work,
        hb: &hb,
        vars,
    };
    f(&scope)
}

/// A pipeline from TOML text; its error diagnostics, if any, as codes.
fn load_with(text: &str) -> (Pipeline, Vec<&'static str>) {
    let src = Source::new("p.toml", "p.toml", text);
    let mut d = Diagnostics::default();
    let p = Pipeline::load(&src, &mut d).expect("a DAG");
    let errors = d
        .items
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.code.as_str())
        .collect();
    (p, errors)
}

fn load(text: &str) -> Pipeline {
    let (p, errors) = load_with(text);
    assert!(errors.is_empty(), "{errors:?}");
    p
}

fn walk_with(p: &Pipeline, host: &Fake, gate: GateVerdict, parallel: bool) -> Walked {
    with_scope(gate, |scope| walk(p, scope, host, parallel))
}

fn run(p: &Pipeline, host: &Fake) -> Walked {
    walk_with(p, host, GateVerdict::Pass, false)
}

/// Statuses by node id, in the file's order.
fn statuses<'p>(p: &'p Pipeline, w: &Walked) -> Vec<(&'p str, NodeStatus)> {
    p.nodes
        .iter()
        .map(|n| n.id.value.as_str())
        .zip(w.status.iter().copied())
        .collect()
}

fn attempts(p: &Pipeline, w: &Walked, id: &str) -> u32 {
    w.timing[p.index[id]].attempts
}

fn retry(node: &str, attempt: &str, reason: &str) -> (String, String, String) {
    (node.into(), attempt.into(), reason.into())
}

fn assert_abort(end: &End, at: &str, why: Failure) {
    match end {
        End::Abort { node, reason } => assert_eq!((node.as_str(), reason), (at, &why)),
        other => panic!("expected an abort at {at}, got {other:?}"),
    }
}

fn assert_done(w: &Walked) {
    assert!(matches!(w.end, End::Done), "{:?}", w.end);
}

use NodeStatus::{Failed, Halt as Halted, NotRun, Ok as Passed, Skip as Skipping, Skipped};

const CHAIN: &str = "[nodes.a]\nkind=\"command\"\nargv=[\"a\"]\n\
                     [nodes.b]\nkind=\"command\"\nargv=[\"b\"]\nneeds=[\"a\"]\n\
                     [nodes.c]\nkind=\"commit\"\nneeds=[\"b\"]\n";

// ---- retries ----------------------------------------------------------------------------

#[test]
fn retries_rerun_a_failing_node_until_it_passes() {
    let p = load(&CHAIN.replace("argv=[\"a\"]", "argv=[\"a\"]\nretries=2"));
    let host = Fake::new(&[("a", &[Exit::Code(1), Exit::Code(7), Exit::Code(0)])]);
    let w = run(&p, &host);
    assert_done(&w);
    assert_eq!(
        statuses(&p, &w),
        [("a", Passed), ("b", Passed), ("c", Passed)]
    );
    assert_eq!(attempts(&p, &w, "a"), 3);
    assert_eq!(attempts(&p, &w, "b"), 1);
    assert_eq!(host.spawned(), ["a", "a", "a", "b"]);
    assert_eq!(
        host.retried(),
        [retry("a", "2", "exit:1"), retry("a", "3", "exit:7")]
    );
    // The commit counted the one output of each node: 0.25 s of a's last attempt, b's.
    assert_eq!(*host.commits.lock().unwrap(), [0.5]);
    assert_eq!(
        w.committed.as_ref().map(|(s, _)| s.iteration_count),
        Some(1)
    );
    assert_eq!(host.settled.load(Ordering::SeqCst), 2);
}

#[test]
fn exhausted_retries_fail_the_node_and_abort_by_default() {
    let p = load(&CHAIN.replace("argv=[\"a\"]", "argv=[\"a\"]\nretries=1"));
    let host = Fake::new(&[("a", &[Exit::Code(1), Exit::Code(2), Exit::Code(0)])]);
    let w = run(&p, &host);
    assert_abort(&w.end, "a", Failure::Exit(2));
    assert_eq!(
        statuses(&p, &w),
        [("a", Failed), ("b", NotRun), ("c", NotRun)]
    );
    assert_eq!(attempts(&p, &w, "a"), 2);
    assert_eq!(host.spawned(), ["a", "a"]);
    assert_eq!(w.outputs[0].as_ref().and_then(|o| o.exit_code), Some(2));
    assert!(w.committed.is_none() && host.commits.lock().unwrap().is_empty());
}

#[test]
fn no_retries_means_one_attempt() {
    let p = load(CHAIN);
    let host = Fake::new(&[("b", &[Exit::Code(1), Exit::Code(0)])]);
    let w = run(&p, &host);
    assert_abort(&w.end, "b", Failure::Exit(1));
    assert_eq!(attempts(&p, &w, "b"), 1);
    assert!(host.retried().is_empty());
}

// ---- on_failure -------------------------------------------------------------------------

#[test]
fn on_failure_continue_lets_the_tick_go_on_and_commit() {
    let p = load(&CHAIN.replace("argv=[\"a\"]", "argv=[\"a\"]\non_failure=\"continue\""));
    let host = Fake::new(&[("a", &[Exit::Code(3)])]);
    let w = run(&p, &host);
    assert_done(&w);
    assert_eq!(
        statuses(&p, &w),
        [("a", Failed), ("b", Passed), ("c", Passed)]
    );
    assert_eq!(w.outputs[0].as_ref().and_then(|o| o.exit_code), Some(3));
    assert!(w.committed.is_some());
}

#[test]
fn on_failure_halt_halts_for_a_human_naming_the_node() {
    let p = load(&CHAIN.replace("argv=[\"b\"]", "argv=[\"b\"]\non_failure=\"halt\""));
    let host = Fake::new(&[("b", &[Exit::Signal(9)])]);
    let w = run(&p, &host);
    match &w.end {
        End::Halt(reason, detail) => {
            assert_eq!(
                reason,
                &HaltReason::HumanIntervention(Intervention::NodeFailed)
            );
            assert_eq!(detail.as_deref(), Some("node b failed: signal:9"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        statuses(&p, &w),
        [("a", Passed), ("b", Failed), ("c", NotRun)]
    );
}

#[test]
fn on_failure_abort_stops_before_the_commit() {
    let p = load(&CHAIN.replace("argv=[\"a\"]", "argv=[\"a\"]\non_failure=\"abort\""));
    let host = Fake::new(&[("a", &[Exit::SpawnFailed("no such file".into())])]);
    let w = run(&p, &host);
    assert_abort(&w.end, "a", Failure::Spawn("no such file".into()));
    assert_eq!(host.spawned(), ["a"]);
}

// ---- when -------------------------------------------------------------------------------

/// `check` fails with `continue`; `fix` runs only when it failed, `celebrate` only when it
/// passed, `report` after `celebrate`; the commit needs `fix`.
const WHEN: &str = "[nodes.check]\nkind=\"command\"\nargv=[\"check\"]\non_failure=\"continue\"\n\
                    [nodes.fix]\nkind=\"command\"\nargv=[\"fix\"]\nneeds=[\"check\"]\nwhen=\"{{not (eq nodes.check.exit_code 0)}}\"\n\
                    [nodes.celebrate]\nkind=\"command\"\nargv=[\"yay\"]\nneeds=[\"check\"]\nwhen=\"{{eq nodes.check.exit_code 0}}\"\n\
                    [nodes.report]\nkind=\"command\"\nargv=[\"r\"]\nneeds=[\"celebrate\"]\n\
                    [nodes.commit]\nkind=\"commit\"\nneeds=[\"fix\", \"report\"]\n";

#[test]
fn when_true_runs_the_node_and_false_skips_it_and_its_dependents() {
    let p = load(&WHEN.replace("needs=[\"fix\", \"report\"]", "needs=[\"fix\"]"));
    let host = Fake::new(&[("check", &[Exit::Code(1)])]);
    let w = run(&p, &host);
    assert_done(&w);
    assert_eq!(
        statuses(&p, &w),
        [
            ("check", Failed),
            ("fix", Passed),
            ("celebrate", Skipped),
            ("report", Skipped),
            ("commit", Passed),
        ]
    );
    assert_eq!(host.spawned(), ["check", "fix"]);
    // Neither skip reached the commit.
    assert_eq!(w.when_skip, None);
    assert!(w.committed.is_some());
}

#[test]
fn a_false_when_upstream_of_the_commit_takes_the_commit_with_it() {
    let p = load(WHEN);
    let host = Fake::new(&[("check", &[Exit::Code(1)])]);
    let w = run(&p, &host);
    // Not an abort: the tick ends having run what it could, and says which `when` it was.
    assert_done(&w);
    assert_eq!(w.when_skip.as_deref(), Some("celebrate"));
    assert_eq!(w.status[p.index["commit"]], Skipped);
    assert_eq!(w.status[p.index["fix"]], Passed);
    assert!(w.committed.is_none() && host.commits.lock().unwrap().is_empty());
    // When `check` passes, `fix` is the one that skips the commit.
    let host = Fake::new(&[]);
    let w = run(&p, &host);
    assert_eq!(w.when_skip.as_deref(), Some("fix"));
    assert_eq!(host.spawned(), ["check", "celebrate", "report"]);
}

#[test]
fn a_when_that_does_not_render_aborts_before_the_node() {
    let text = CHAIN.replace("argv=[\"b\"]", "argv=[\"b\"]\nwhen=\"{{nodes.a.nope}}\"");
    let (p, errors) = load_with(&text);
    assert_eq!(errors, ["unknown-variable"], "check catches it first");
    let host = Fake::new(&[]);
    let w = run(&p, &host);
    match &w.end {
        End::Abort {
            node,
            reason: Failure::When(why),
        } => assert!(node == "b" && why.contains("nope"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(host.spawned(), ["a"]);
    assert_eq!(
        statuses(&p, &w),
        [("a", Passed), ("b", NotRun), ("c", NotRun)]
    );
}

// ---- parallel equals sequential ---------------------------------------------------------

/// `a`, then two branches: `b` fails (continue) and `d` skips on it; `c` passes on its
/// second try and `e` follows it; the commit needs both branches' ends.
const BRANCHES: &str = "[nodes.a]\nkind=\"command\"\nargv=[\"a\"]\n\
                        [nodes.b]\nkind=\"command\"\nargv=[\"b\"]\nneeds=[\"a\"]\non_failure=\"continue\"\n\
                        [nodes.c]\nkind=\"command\"\nargv=[\"c\"]\nneeds=[\"a\"]\nretries=1\n\
                        [nodes.d]\nkind=\"command\"\nargv=[\"d\"]\nneeds=[\"b\"]\nwhen=\"{{eq nodes.b.exit_code 0}}\"\n\
                        [nodes.e]\nkind=\"command\"\nargv=[\"e\"]\nneeds=[\"c\"]\n\
                        [nodes.f]\nkind=\"command\"\nargv=[\"f\"]\nneeds=[\"e\"]\n\
                        [nodes.commit]\nkind=\"commit\"\nneeds=[\"f\"]\n";

fn branches_host(meet: Option<&'static [&'static str]>) -> Fake {
    Fake {
        meet: meet.map(|m| (m, Mutex::new(0), Condvar::new())),
        ..Fake::new(&[("b", &[Exit::Code(4)]), ("c", &[Exit::TimedOut])])
    }
}

/// What must not depend on `--parallel`: the end, every status and attempt count, the
/// commit, and which nodes ran how often.
fn outcome(p: &Pipeline, w: &Walked, host: &Fake) -> String {
    let mut spawned = host.spawned();
    spawned.sort();
    let tries: Vec<u32> = w.timing.iter().map(|t| t.attempts).collect();
    let committed = w.committed.as_ref().map(|(s, h)| (s.iteration_count, h));
    format!(
        "{:?} {:?} {tries:?} {committed:?} {:?} {spawned:?}",
        w.end,
        statuses(p, w),
        w.when_skip
    )
}

#[test]
fn a_parallel_walk_ends_as_a_sequential_one() {
    let p = load(BRANCHES);
    let seq = branches_host(None);
    let ws = walk_with(&p, &seq, GateVerdict::Pass, false);
    // `b` and `c` wait for each other: the parallel walk must run them at once.
    let par = branches_host(Some(&["b", "c"]));
    let wp = walk_with(&p, &par, GateVerdict::Pass, true);
    assert!(
        par.met.load(Ordering::SeqCst),
        "b and c did not run together"
    );
    assert_eq!(outcome(&p, &wp, &par), outcome(&p, &ws, &seq));
    assert_done(&ws);
    assert_eq!(
        statuses(&p, &ws),
        [
            ("a", Passed),
            ("b", Failed),
            ("c", Passed),
            ("d", Skipped),
            ("e", Passed),
            ("f", Passed),
            ("commit", Passed),
        ]
    );
    assert_eq!(attempts(&p, &wp, "c"), 2);
    assert_eq!(seq.spawned(), ["a", "b", "c", "c", "e", "f"]);
}

#[test]
fn a_commit_waits_for_an_earlier_independent_failure() {
    // The commit needs nothing, so a parallel walk could take it in `x`'s wave; it waits
    // for every node before it in the sequential order, and `x`'s failure stops both walks.
    let p = load(
        "[nodes.x]\nkind=\"command\"\nargv=[\"x\"]\n\
         [nodes.commit]\nkind=\"commit\"\n",
    );
    for parallel in [false, true] {
        let host = Fake::new(&[("x", &[Exit::Code(4)])]);
        let w = walk_with(&p, &host, GateVerdict::Pass, parallel);
        assert_abort(&w.end, "x", Failure::Exit(4));
        assert_eq!(statuses(&p, &w), [("x", Failed), ("commit", NotRun)]);
        assert!(w.committed.is_none() && host.commits.lock().unwrap().is_empty());
    }
    // With `x` passing, both walks commit.
    for parallel in [false, true] {
        let host = Fake::default();
        let w = walk_with(&p, &host, GateVerdict::Pass, parallel);
        assert_eq!(statuses(&p, &w), [("x", Passed), ("commit", Passed)]);
        assert_eq!(host.commits.lock().unwrap().len(), 1);
    }
}

// ---- timeouts, interrupts and the host's stops ------------------------------------------

#[test]
fn a_timed_out_spawn_fails_as_a_timeout_and_gets_the_nodes_timeout() {
    let p = load(&CHAIN.replace("argv=[\"a\"]", "argv=[\"a\"]\ntimeout=\"90s\""));
    let host = Fake::new(&[("a", &[Exit::TimedOut])]);
    let w = run(&p, &host);
    assert_abort(&w.end, "a", Failure::Timeout);
    assert_eq!(
        *host.spawns.lock().unwrap(),
        [("a".to_string(), Some(Duration::from_secs(90)))]
    );
    // A timed-out process has no exit code, but its time counts.
    let out = w.outputs[0].as_ref().expect("a's output");
    assert_eq!((out.exit_code, out.seconds), (None, 0.25));
}

#[test]
fn a_timeout_is_retried_like_any_failure() {
    let p = load(&CHAIN.replace("argv=[\"b\"]", "argv=[\"b\"]\nretries=1"));
    let host = Fake::new(&[("b", &[Exit::TimedOut, Exit::Code(0)])]);
    let w = run(&p, &host);
    assert_done(&w);
    assert_eq!(attempts(&p, &w, "b"), 2);
    assert_eq!(host.retried(), [retry("b", "2", "timeout")]);
    // `b` set no timeout of its own.
    assert!(host.spawns.lock().unwrap().iter().all(|(_, t)| t.is_none()));
}

#[test]
fn cancellation_aborts_at_the_next_node_as_interrupted() {
    let p = load(CHAIN);
    let host = Fake {
        cancel_in: Some("a"),
        ..Fake::default()
    };
    let w = run(&p, &host);
    assert_abort(&w.end, "b", Failure::Interrupted);
    assert_eq!(
        statuses(&p, &w),
        [("a", Passed), ("b", NotRun), ("c", NotRun)]
    );
    assert_eq!(host.spawned(), ["a"]);
}

#[test]
fn an_interrupted_node_is_never_retried_and_always_aborts() {
    let p = load(&CHAIN.replace(
        "argv=[\"a\"]",
        "argv=[\"a\"]\nretries=3\non_failure=\"continue\"",
    ));
    let host = Fake::new(&[("a", &[Exit::Interrupted, Exit::Code(0)])]);
    let w = run(&p, &host);
    assert_abort(&w.end, "a", Failure::Interrupted);
    assert_eq!(attempts(&p, &w, "a"), 1);
    assert!(host.retried().is_empty());
}

#[test]
fn a_host_stop_halts_or_fails_the_node_it_stops() {
    let p = load(CHAIN);
    let halt = Stop::Halt(HaltReason::BudgetExhausted(Budget::Usd), "spent $5".into());
    let host = Fake {
        stop_at: Some((2, halt)),
        ..Fake::default()
    };
    let w = run(&p, &host);
    match &w.end {
        End::Halt(r, d) => assert_eq!(
            (r, d.as_deref()),
            (&HaltReason::BudgetExhausted(Budget::Usd), Some("spent $5"))
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        statuses(&p, &w),
        [("a", Passed), ("b", Halted), ("c", NotRun)]
    );
    assert_eq!(host.spawned(), ["a"]);
    // A `Fail` goes through `on_failure`, but is not retried (each attempt asks the host
    // first, and the first refusal ends the node).
    let p = load(&CHAIN.replace(
        "argv=[\"b\"]",
        "argv=[\"b\"]\nretries=2\non_failure=\"continue\"",
    ));
    let fail = Stop::Fail(Failure::State("outputs/ is a symlink".into()));
    let host = Fake {
        stop_at: Some((2, fail)),
        ..Fake::default()
    };
    let w = run(&p, &host);
    assert_done(&w);
    assert_eq!(
        statuses(&p, &w),
        [("a", Passed), ("b", Failed), ("c", Passed)]
    );
    assert_eq!(attempts(&p, &w, "b"), 1);
    assert_eq!(host.spawned(), ["a"]);
}

#[test]
fn a_gate_that_skips_or_halts_ends_the_walk_there() {
    let p = load(&format!(
        "[nodes.g]\nkind=\"gate\"\n{}",
        CHAIN.replace("argv=[\"a\"]", "argv=[\"a\"]\nneeds=[\"g\"]")
    ));
    let host = Fake::default();
    let w = walk_with(
        &p,
        &host,
        GateVerdict::Skip(SkipReason::NoCurrentTask),
        false,
    );
    assert!(
        matches!(&w.end, End::Skip(SkipReason::NoCurrentTask)),
        "{:?}",
        w.end
    );
    assert_eq!(w.status, [Skipping, NotRun, NotRun, NotRun]);
    assert!(host.spawned().is_empty());
    let halt = GateVerdict::Halt {
        reason: HaltReason::IterationsExhausted,
        detail: "5 of 5".into(),
    };
    let w = walk_with(&p, &host, halt, true);
    assert!(
        matches!(&w.end, End::Halt(HaltReason::IterationsExhausted, Some(d)) if d == "5 of 5"),
        "{:?}",
        w.end
    );
    assert_eq!(w.status, [Halted, NotRun, NotRun, NotRun]);
}

#[test]
fn a_node_that_panics_in_a_parallel_wave_fails_itself_alone() {
    let p = load(
        "[nodes.a]\nkind=\"command\"\nargv=[\"a\"]\n\
         [nodes.b]\nkind=\"command\"\nargv=[\"b\"]\nneeds=[\"a\"]\n\
         [nodes.c]\nkind=\"command\"\nargv=[\"c\"]\nneeds=[\"a\"]\n\
         [nodes.commit]\nkind=\"commit\"\nneeds=[\"b\", \"c\"]\n",
    );
    let host = Fake {
        panic_in: Some("c"),
        ..Fake::default()
    };
    let w = walk_with(&p, &host, GateVerdict::Pass, true);
    assert_abort(&w.end, "c", Failure::Panic);
    assert_eq!(
        statuses(&p, &w),
        [
            ("a", Passed),
            ("b", Passed),
            ("c", Failed),
            ("commit", NotRun)
        ]
    );
}
