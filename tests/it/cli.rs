//! CLI conventions (issue 12): completions and man pages that their tools accept, stdout
//! for data (one JSON document per `--json`, quiet on a closed pipe), the project found
//! upward from a subdirectory, `status` that never calls a broken loop `ok`, and text an
//! agent wrote escaped before a terminal sees it.

use serde_json::Value;

use crate::support::{Project, standard_agent};

const PASS: &str = r#"{"pass": true, "score": 0.9}"#;

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
