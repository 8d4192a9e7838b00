//! The tick end to end (the seed's R7 list, translated), driving the real binary.

mod common;

use common::{Project, standard_agent};

#[test]
fn tick_pass_advances_and_logs() {
    let p = Project::new();
    let agent = standard_agent(&p, &[r#"{"pass": true, "score": 0.9}"#]);
    p.agent_loop("l", &agent, "goal_score = 1.0");
    let r = p.lf(&["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 1);
    assert_eq!(s["last_verdict"]["pass"], true);
    assert!(
        p.events("l")
            .contains(&"TICK pass=true score=0.9 iter=1".to_string()),
        "{:?}",
        p.events("l")
    );
    assert_eq!(
        p.read("calls.log"),
        "implement 1\nverify 1\norchestrate 1\n"
    );
}
