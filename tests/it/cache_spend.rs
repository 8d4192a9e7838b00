//! The verdict cache replays a verdict without running the verifier, so a replay spends
//! nothing: neither the replayed verdict's `cost_usd`/`tokens` nor the usage the agent's
//! replayed output reports are counted again.

use crate::support::{LoopToml, Project};

/// An agent whose implement role writes `$output` ("a" on ticks 1-2, "b" on 3-4, so the
/// verifier is replayed on ticks 2 and 4) and whose verify role prints `verdict`.
/// `envelope` wraps every answer in a Claude Code JSON result costing $0.10.
fn agent(tools: &Project, verdict: &str, envelope: bool) -> std::path::PathBuf {
    let print = if envelope {
        r#"printf '{"type":"result","result":%s,"total_cost_usd":0.1,"usage":{"input_tokens":7,"output_tokens":3}}\n' "$(printf '%s' "$1" | sed 's/"/\\"/g; s/^/"/; s/$/"/')""#
    } else {
        r#"printf '%s\n' "$1""#
    };
    tools.script(
        "agent.sh",
        &format!(
            r#"role="$1"; output="$2"
say() {{ {print}; }}
echo "$role $LOOPFLOW_TICK" >> "{calls}"
case "$role" in
  implement) if [ "$LOOPFLOW_TICK" -le 2 ]; then echo a > "$output"; else echo b > "$output"; fi; say done ;;
  verify) say '{verdict}' ;;
  *) say ok ;;
esac"#,
            calls = tools.join("calls").display(),
        ),
    )
}

fn verify_runs(tools: &Project) -> usize {
    tools
        .read("calls")
        .lines()
        .filter(|l| l.starts_with("verify "))
        .count()
}

fn run_four(p: &Project, toml: &LoopToml) {
    p.with_loop("c", toml);
    for _ in 0..4 {
        let r = p.run_json("c", &[]);
        assert_eq!(r.code, 0, "{r:?}");
    }
}

#[test]
fn a_replayed_verdict_does_not_charge_its_cost_again() {
    let (p, tools) = (Project::new(), Project::new());
    let a = agent(
        &tools,
        r#"{"pass": false, "score": 0.5, "cost_usd": 0.1, "tokens": 10}"#,
        false,
    );
    let toml = LoopToml::new()
        .harness_command(&a, &["{{role}}", "{{output}}"])
        .brakes("score_plateau_window = 10")
        .role("verify", "cache = true");
    run_four(&p, &toml);
    assert_eq!(verify_runs(&tools), 2, "{}", tools.read("calls"));
    let s = p.state("c");
    assert_eq!(s["iteration_count"], 4, "{s}");
    // Two real verifications at $0.10 each; the two replays cost nothing.
    assert!(
        (s["spent"]["usd"].as_f64().unwrap() - 0.2).abs() < 1e-9,
        "{s}"
    );
    assert_eq!(s["spent"]["tokens"], 20, "{s}");
}

#[test]
fn a_replayed_agent_report_does_not_charge_its_usage_again() {
    let (p, tools) = (Project::new(), Project::new());
    let a = agent(&tools, r#"{"pass": false, "score": 0.5}"#, true);
    let toml = LoopToml::new()
        .harness_command(&a, &["{{role}}", "{{output}}"])
        // Read like the claude-code preset reads Claude Code's JSON result.
        .harness(
            r#"usage = { format = "json", text = "/result", cost_usd = ["/total_cost_usd"], tokens = ["/usage/input_tokens", "/usage/output_tokens"] }"#,
        )
        .brakes("score_plateau_window = 10")
        .role("verify", "cache = true");
    run_four(&p, &toml);
    assert_eq!(verify_runs(&tools), 2, "{}", tools.read("calls"));
    let s = p.state("c");
    assert_eq!(s["iteration_count"], 4, "{s}");
    // implement and orchestrate every tick (8 runs) plus 2 real verifications: 10 × $0.10.
    assert!(
        (s["spent"]["usd"].as_f64().unwrap() - 1.0).abs() < 1e-9,
        "{s}"
    );
    assert_eq!(s["spent"]["tokens"], 100, "{s}");
}
