//! CLI conventions (issue 12): completions and man pages that their tools accept, stdout
//! for data (one JSON document per `--json`, quiet on a closed pipe), the project found
//! upward from a subdirectory, `status` that never calls a broken loop `ok`, and text an
//! agent wrote escaped before a terminal sees it.

use serde_json::Value;

use crate::support::{Project, standard_agent};

const PASS: &str = r#"{"pass": true, "score": 0.9}"#;
const HALF: &str = r#"{"pass": false, "score": 0.5}"#;

/// A project with loop `l` driven by the standard agent (max 10 iterations).
fn agent_project(verdicts: &[&str], brakes: &str) -> Project {
    let p = Project::new();
    let a = standard_agent(&p, verdicts);
    p.agent_loop("l", &a, brakes);
    p
}

// ---- status never calls a broken loop ok ---------------------------------------------------

#[test]
fn the_gate_node_reports_how_it_ended_the_tick() {
    let p = agent_project(&[PASS], "max_iterations = 1");
    let gate = |j: &Value| -> String {
        let node = j["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == "gate");
        node.unwrap()["status"].as_str().unwrap().to_string()
    };
    let ran = p.run_json("l", &[]).json();
    assert_eq!(gate(&ran), "ok");
    let halted = p.run_json("l", &[]).json();
    assert_eq!(halted["outcome"], "halt");
    assert_eq!(gate(&halted), "halt");
    let skipped = p.run_json("l", &[]).json();
    assert_eq!(skipped["outcome"], "skip");
    assert_eq!(gate(&skipped), "skip");
}

// ---- display safety -----------------------------------------------------------------------

#[test]
fn check_quotes_a_huge_unknown_key_in_part() {
    let p = Project::new();
    let key = "k".repeat(10_000_000);
    let file = p.write("big.toml", &format!("name = \"x\"\n{key} = 1\n"));
    let r = p.lf(&["check", file.to_str().unwrap()]);
    assert_eq!(r.code, 3, "{r:?}");
    let all = r.stdout.len() + r.stderr.len();
    assert!(all < 10_000, "{all} bytes of diagnostics");
    assert!(
        (r.stdout.clone() + &r.stderr).contains(&format!("unknown key `{}…`", &key[..80])),
        "{r:?}"
    );
}

// ---- state files left by killed writes ------------------------------------------------------

#[test]
fn a_tick_removes_temp_files_of_killed_writes() {
    let p = agent_project(&[HALF], "");
    let dir = p.loop_dir("l");
    let stale = dir.join(".state.tmpKILLED");
    let fresh = dir.join(".state.tmpRECENT");
    std::fs::write(&stale, "{\"half\":").unwrap();
    std::fs::write(&fresh, "{\"half\":").unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    // A dry run writes nothing, temp files included.
    assert_eq!(p.lf(&["run", "--loop", "l", "--dry-run"]).code, 0);
    assert!(stale.exists());
    p.run_json("l", &[]);
    assert!(!stale.exists(), "a leftover of a killed write stays");
    // A minute-young one may belong to a write in progress beside the tick.
    assert!(fresh.exists());
}
