//! The schedulers generated for a remote loop (DESIGN §16), judged by actionlint and
//! kubernetes-validate, read for what the design promises, and one workflow run end to
//! end offline: its steps executed in order (`tests/remote/run_workflow.py`) in fresh
//! shallow clones against a token-guarded smart-HTTP remote.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::support::remote::{
    Remote, Transport, clone_with_token, quick_agent, remote_toml, start_with_token,
};
use crate::support::{Project, bin, has, have};

const TOKEN: &str = "ghs_workflowTokenNeverInAConfigFile0123456789";

fn print(p: &Project, platform: &str, extra: &[&str]) -> String {
    let mut args = vec!["schedule", "print", "--loop", "r", "--platform", platform];
    args.extend(extra);
    let r = p.lf_env(&args, &[("LOOPFLOW_GIT_TOKEN", TOKEN)]);
    assert_eq!(r.code, 0, "{r:?}");
    r.stdout
}

fn validate(tool: &str, file: &Path) {
    if !have(tool) {
        return;
    }
    let out = Command::new(tool).arg(file).output().expect(tool);
    assert!(
        out.status.success(),
        "{tool}: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(file).unwrap_or_default()
    );
}

/// The steps of the generated workflow that hold the token in their environment.
fn token_steps(wf: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut current = String::new();
    for l in wf.lines() {
        if let Some(n) = l.trim_start().strip_prefix("- name: ") {
            current = n.to_string();
        } else if l.trim_start().starts_with("- uses: ") {
            current = l.trim().to_string();
        }
        if l.contains("github.token") {
            names.push(current.clone());
        }
    }
    names
}

#[test]
fn the_generated_files_keep_the_designs_promises_and_pass_their_validators() {
    let remote = Remote::with_token(Transport::Http, Some(TOKEN));
    let tools = tempfile::tempdir().expect("tempdir");
    let human = start_with_token(
        &remote,
        "r",
        &remote_toml(&quick_agent(tools.path())),
        TOKEN,
    );
    let wf = print(&human, "github-actions", &[]);
    for (what, ok) in [
        ("no actions/cache", !wf.contains("actions/cache")),
        (
            "persist-credentials: false",
            wf.contains("persist-credentials: false"),
        ),
        ("queue: max", wf.contains("queue: max")),
        (
            "cancel-in-progress: false",
            wf.contains("cancel-in-progress: false"),
        ),
        (
            "inputs",
            ["approve:", "extend:", "note:", "task:"]
                .iter()
                .all(|i| wf.contains(i)),
        ),
        ("a scattered minute", !wf.contains("cron: \"0 ")),
    ] {
        assert!(ok, "{what}:\n{wf}");
    }
    assert_eq!(
        token_steps(&wf),
        ["A human's word", "Gate", "Tick"],
        "the token only in loopflow's own steps:\n{wf}"
    );
    let gate = wf.find("- name: Gate").expect("gate");
    let agent = wf.find("- name: Agent").expect("agent step");
    assert!(gate < agent, "the gate before the agent is installed");
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("loopflow-r.yml");
    std::fs::write(&f, &wf).expect("write");
    validate("actionlint", &f);

    let k = print(
        &human,
        "kubernetes",
        &["--image", "registry.example.org/lf:1"],
    );
    for (what, ok) in [
        ("an emptyDir", k.contains("emptyDir: {}")),
        ("no volume of record", !k.contains("PersistentVolumeClaim")),
        (
            "no service-account token",
            k.contains("automountServiceAccountToken: false"),
        ),
        (
            "the credential from a Secret file",
            k.contains("LOOPFLOW_GIT_TOKEN_FILE"),
        ),
        ("slots", k.contains("\"--slot\", \"auto\"")),
        ("the remote's URL", k.contains(&remote.url)),
        ("no token in the file", !k.contains(TOKEN)),
    ] {
        assert!(ok, "{what}:\n{k}");
    }
    // Where the Secret is mounted, a tick's processes may not read (`run --dry-run` says
    // what they may).
    let dry = human.lf(&["run", "--loop", "r", "--dry-run"]);
    assert!(!dry.stdout.contains("/var/run"), "{dry:?}");
    let f = dir.path().join("loopflow-r.yaml");
    std::fs::write(&f, &k).expect("write");
    validate("kubernetes-validate", &f);
}

/// One run of the workflow: its steps in order, as a runner executes them.
fn run_workflow(wf: &Path, remote: &Remote, event: &str, inputs: &str) -> Value {
    let ws = tempfile::tempdir().expect("tempdir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/remote/run_workflow.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(wf)
        .arg("--workspace")
        .arg(ws.path().join("w"))
        .args(["--event", event, "--inputs", inputs, "--token", TOKEN])
        .args(["--checkout", &remote.url])
        .env_remove("LOOPFLOW_GIT_TOKEN")
        .output()
        .expect("python3 run_workflow.py");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let config = std::fs::read_to_string(ws.path().join("w/.git/config")).unwrap_or_default();
    assert!(
        !config.contains("extraheader"),
        "no credential left in .git/config: {config}"
    );
    assert!(
        !report["failed"].as_bool().unwrap_or(true),
        "{report:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

fn ran(report: &Value, step: &str) -> bool {
    report["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["name"] == step)
        .unwrap_or_else(|| panic!("no step {step}: {report:#}"))["ran"]
        .as_bool()
        .expect("ran")
}

#[test]
fn a_generated_workflow_runs_end_to_end_offline() {
    let remote = Remote::with_token(Transport::Http, Some(TOKEN));
    let tools = tempfile::tempdir().expect("tempdir");
    let human = start_with_token(
        &remote,
        "r",
        &remote_toml(&quick_agent(tools.path())),
        TOKEN,
    );
    let sha = Command::new("sha256sum")
        .arg(bin())
        .output()
        .expect("sha256sum");
    let sha = String::from_utf8_lossy(&sha.stdout);
    let sha = sha.split_whitespace().next().expect("sha");
    let url = format!("file://{}", bin().display());
    let wf = print(
        &human,
        "github-actions",
        &["--binary-url", &url, "--binary-sha256", sha],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("loopflow-r.yml");
    std::fs::write(&f, &wf).expect("write");
    // A scheduled run ticks its slot.
    let one = run_workflow(&f, &remote, "schedule", "{}");
    assert!(ran(&one, "Tick"), "{one:#}");
    assert_eq!(remote.state("r")["iteration_count"], 1);
    // The same slot again (a re-run, an overlapping run): it is not ticked twice.
    let again = run_workflow(&f, &remote, "schedule", "{}");
    assert!(ran(&again, "Tick"), "{again:#}");
    assert_eq!(
        remote.state("r")["iteration_count"],
        1,
        "{:#?}",
        remote.events("r")
    );
    // Halted: the scheduled run stops at the gate, before anything for the agent.
    let laptop = clone_with_token(&remote, TOKEN);
    let h = laptop.lf_env(
        &["halt", "--loop", "r", "--reason", "review first"],
        &[("LOOPFLOW_GIT_TOKEN", TOKEN)],
    );
    assert_eq!(h.code, 0, "{h:?}");
    let halted = run_workflow(&f, &remote, "schedule", "{}");
    assert!(ran(&halted, "Gate"));
    assert!(
        !ran(&halted, "Agent") && !ran(&halted, "Tick"),
        "{halted:#}"
    );
    // "Run workflow" with approve: the human's word first, then the tick.
    let approved = run_workflow(
        &f,
        &remote,
        "workflow_dispatch",
        r#"{"approve": true, "extend": 2, "note": "looked good"}"#,
    );
    assert!(
        ran(&approved, "A human's word") && ran(&approved, "Tick"),
        "{approved:#}"
    );
    let state = remote.state("r");
    assert_eq!(state["iteration_count"], 2, "{state}");
    assert_eq!(state["extra_iterations"], 2);
    let events = remote.events("r");
    assert!(
        has(
            &events,
            "APPROVE by=octocat note=\"looked good\" cleared=\"review first\" extend=2"
        ),
        "{events:#?}"
    );
    assert_eq!(remote.branch_commits("r"), 2);
}
