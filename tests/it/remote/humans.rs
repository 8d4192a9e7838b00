//! Humans from any clone, at any path (DESIGN §16): `status`, `log`, `halt`, `approve`
//! (with `--extend`), `review`, `land` and `discard` on a remote loop fetch its record
//! first and write by compare-and-swap; an approval during a live lease is refused, a halt
//! is not and stands; a runner never starts or resets a loop.

use std::process::Stdio;

use crate::support::remote::{FaultAgent, Remote, Transport, quick_agent, remote_toml, start_loop};
use crate::support::{Project, Run, git, has, loopflow};

/// `loopflow ARGS` run from a subdirectory of `p`, with no `--project`: the project is
/// found upward, as a human at any path of a clone finds it.
fn from_inside(p: &Project, args: &[&str]) -> Run {
    let sub = p.join("docs/deep");
    std::fs::create_dir_all(&sub).expect("mkdir");
    Run::of(loopflow(&sub).args(args).env_remove("LOOPFLOW_PROJECT"))
}

fn tick(p: &Project) -> Run {
    let r = p.lf(&["run", "--loop", "r", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    r
}

#[test]
fn a_fresh_clone_sees_halts_and_approves_with_extend() {
    let remote = Remote::new(Transport::Http);
    let tools = tempfile::tempdir().expect("tempdir");
    let toml = remote_toml(&quick_agent(tools.path())).brakes("max_iterations = 1");
    let _human = start_loop(&remote, "r", &toml);
    let runner = remote.clone();
    assert_eq!(tick(&runner).json()["outcome"], "tick");
    assert_eq!(tick(&runner).json()["reason"], "iterations_exhausted");
    // A laptop's clone, never used for this loop: status and log come from the record.
    let laptop = remote.clone();
    let st = from_inside(&laptop, &["status", "--json"]);
    assert_eq!(st.code, 0, "{st:?}");
    let st: serde_json::Value = serde_json::from_str(&st.stdout).expect("json");
    assert_eq!(st["loops"][0]["iteration_count"], 1, "{st}");
    assert_eq!(
        st["loops"][0]["halt"]["reason"], "iterations_exhausted",
        "{st}"
    );
    let log = from_inside(&laptop, &["log", "--loop", "r"]);
    assert!(log.stdout.contains("HALT iterations_exhausted"), "{log:?}");
    // Without --extend it would halt again at once; with it, two more iterations.
    let ok = from_inside(
        &laptop,
        &[
            "approve", "--loop", "r", "--extend", "2", "--by", "alice", "--note", "go on",
        ],
    );
    assert_eq!(ok.code, 0, "{ok:?}");
    let state = remote.state("r");
    assert!(state["halt"].is_null(), "{state}");
    assert_eq!(state["extra_iterations"], 2);
    assert_eq!(state["approvals"][0]["by"], "alice");
    assert!(has(
        &remote.events("r"),
        "APPROVE by=alice note=\"go on\" cleared=iterations_exhausted extend=2"
    ));
    let r = tick(&runner);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(r.json()["iteration"], 2);
}

/// While a runner holds the lease, an approval from another clone is refused (as the tick
/// lock refuses one today); a halt is taken, and stands after the tick's settle, which
/// still records the tick.
#[test]
fn an_approval_during_a_lease_is_refused_and_a_halt_stands() {
    let remote = Remote::new(Transport::File);
    let f = FaultAgent::new();
    f.wait_in("verify");
    let _human = start_loop(&remote, "r", &f.toml(false).harness("timeout = \"60s\""));
    let (a, laptop) = (remote.clone(), remote.clone());
    let runner = a
        .lf_cmd(&["run", "--loop", "r", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    f.started();
    let no = laptop.lf(&["approve", "--loop", "r", "--extend", "5"]);
    assert_eq!(no.code, 1, "{no:?}");
    assert!(no.stderr.contains("holds its lease"), "{no:?}");
    let halt = laptop.lf(&["halt", "--loop", "r", "--reason", "wait for the API freeze"]);
    assert_eq!(halt.code, 0, "{halt:?}");
    f.go();
    let r = Run::from(runner.wait_with_output().expect("wait"));
    assert_eq!(r.code, 0, "{r:?}");
    let state = remote.state("r");
    assert_eq!(state["iteration_count"], 1, "the tick counts: {state}");
    assert_eq!(
        state["halt"]["reason"], "wait for the API freeze",
        "{state}"
    );
    assert_eq!(
        state["extra_iterations"], 0,
        "the refused approval left nothing"
    );
    let events = remote.events("r");
    assert!(has(&events, "HALT wait for the API freeze"), "{events:#?}");
    // The next run skips: a halt stands until a human approves it.
    assert_eq!(tick(&a).json()["reason"], "halted:wait for the API freeze");
}

/// `review` shows what the runners did, `land` merges it into the human's checkout and
/// records it, `discard` resets the remote branch to the human's HEAD.
#[test]
fn review_land_and_discard_from_a_laptop() {
    let remote = Remote::new(Transport::Daemon);
    let tools = tempfile::tempdir().expect("tempdir");
    let _human = start_loop(&remote, "r", &remote_toml(&quick_agent(tools.path())));
    let runner = remote.clone();
    tick(&runner);
    tick(&runner);
    let laptop = remote.clone();
    let rv = laptop.lf(&["review", "--loop", "r", "--json"]);
    assert_eq!(rv.code, 0, "{rv:?}");
    let rv: serde_json::Value = serde_json::from_str(&rv.stdout).expect("json");
    assert_eq!(rv["commit_count"], 2, "{rv}");
    let landed = laptop.lf(&["land", "--loop", "r"]);
    assert_eq!(landed.code, 0, "{landed:?}");
    assert!(
        laptop.read("work.txt").contains("tick 2"),
        "landed in the checkout"
    );
    assert!(
        remote
            .events("r")
            .iter()
            .any(|e| e.starts_with("LAND into=main commits=2"))
    );
    // Discard: the branch goes back to the laptop's HEAD (which has the landed work).
    tick(&runner);
    let d = laptop.lf(&["discard", "--loop", "r", "--yes"]);
    assert_eq!(d.code, 0, "{d:?}");
    let head = git(laptop.path(), &["rev-parse", "HEAD"]);
    assert_eq!(
        remote.rev("refs/heads/loopflow/r"),
        Some(head.trim().to_string())
    );
    assert!(remote.events("r").iter().any(|e| e.starts_with("DISCARD ")));
}

/// A runner never starts a loop: a committed loop.toml with `[remote]` and no state ref
/// skips (exit 0) and writes nothing remote; and a runner's lost or forged cache never
/// resets the record.
#[test]
fn runners_neither_start_nor_reset_a_loop() {
    let remote = Remote::new(Transport::File);
    let tools = tempfile::tempdir().expect("tempdir");
    let toml = remote_toml(&quick_agent(tools.path()));
    // A loop.toml committed without `create --remote`.
    let p = Project::git();
    p.git_cmd(&["remote", "add", "origin", &remote.url]);
    p.write(".loopflow/loops/n/loop.toml", &toml.render());
    for f in [
        "loop-implement.md",
        "loop-verifier.md",
        "loop-orchestrate.md",
    ] {
        p.write(&format!(".loopflow/loops/n/prompts/{f}"), "do the task\n");
    }
    p.commit_all("a loop nobody started");
    p.git_cmd(&["push", "-q", "origin", "main"]);
    let runner = remote.clone();
    let r = runner.lf(&["run", "--loop", "n"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("skipped (untracked)"), "{r:?}");
    assert_eq!(remote.rev("refs/loopflow/n/state"), None);
    assert_eq!(remote.rev("refs/heads/loopflow/n"), None);
    // A started loop: the runner's cache evicted, then forged, changes nothing of record.
    let remote = Remote::new(Transport::File);
    let _human = start_loop(&remote, "r", &toml);
    let runner = remote.clone();
    tick(&runner);
    tick(&runner);
    std::fs::remove_file(runner.loop_dir("r").join(".state.loop")).expect("evict");
    assert_eq!(tick(&runner).json()["iteration"], 3);
    runner.edit_state("r", |s| {
        s["iteration_count"] = 0.into();
        s["halt"] = serde_json::Value::Null;
        s["approvals"] = serde_json::json!([{"by": "mallory", "at": "2026-01-01T00:00:00Z", "note": null, "cleared": null}]);
    });
    assert_eq!(tick(&runner).json()["iteration"], 4);
    let state = remote.state("r");
    assert_eq!(state["iteration_count"], 4);
    assert_eq!(
        state["approvals"].as_array().map(Vec::len),
        Some(0),
        "{state}"
    );
    // And create refuses a loop the remote already has, writing nothing.
    let other = remote.clone();
    std::fs::remove_dir_all(other.loop_dir("r")).expect("rm");
    let c = other.lf(&["create", "--loop", "r", "--remote", "origin"]);
    assert_eq!(c.code, 2, "{c:?}");
    assert!(c.stderr.contains("already lives on remote origin"), "{c:?}");
    assert!(!other.loop_dir("r").exists());
}

/// The dashboard of a clone that never ticked the loop shows it from its record.
#[test]
fn the_dashboard_shows_a_remote_loop_from_its_record() {
    let remote = Remote::new(Transport::File);
    let tools = tempfile::tempdir().expect("tempdir");
    let _human = start_loop(&remote, "r", &remote_toml(&quick_agent(tools.path())));
    let runner = remote.clone();
    tick(&runner);
    tick(&runner);
    let laptop = remote.clone();
    let d = crate::dashboard::Dashboard::start_with(&laptop, &[]);
    let (code, _, body) = d.get("/api/status");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let r = v["loops"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == "r"))
        .unwrap_or_else(|| panic!("loop r listed: {v}"));
    assert_eq!(r["iteration_count"], 2, "{r}");
}
