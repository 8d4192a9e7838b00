//! `loopflow report --html`: a page a human reads before approving; agent-written text
//! in it must be inert.

use crate::support::{Project, standard_agent};

#[test]
fn report_lists_loops_and_escapes_agent_text() {
    let p = Project::new();
    let agent = standard_agent(
        &p,
        &[
            r#"{"pass": false, "score": 0.4, "reasons": ["</pre><img src=x onerror=alert(1)>"], "next_hint": "<b>bold</b> & more"}"#,
        ],
    );
    p.agent_loop("l", &agent, "");
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    assert_eq!(
        p.lf(&[
            "halt",
            "--loop",
            "l",
            "--reason",
            "<script>alert(1)</script>"
        ])
        .code,
        0
    );
    let out = p.join("report.html");
    let r = p.lf(&["report", "--html", out.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{r:?}");
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.starts_with("<!doctype html>"));
    for raw in ["<script", "<img", "<b>"] {
        assert!(!html.contains(raw), "unescaped {raw} in the report");
    }
    assert!(
        html.contains("HALTED &lt;script&gt;alert(1)&lt;/script&gt;"),
        "{html}"
    );
    assert!(
        html.contains("&lt;/pre&gt;&lt;img src=x onerror=alert(1)&gt;"),
        "{html}"
    );
    assert!(
        html.contains("&lt;b&gt;bold&lt;/b&gt; &amp; more"),
        "{html}"
    );
    assert!(html.contains("TICK pass=false score=0.4 iter=1"), "{html}");
    assert!(
        html.contains("approve --loop l"),
        "a halted loop says how to approve it"
    );
}

#[test]
fn report_of_an_empty_project_says_so() {
    let p = Project::new();
    let out = p.join("r.html");
    let r = p.lf(&["report", "--html", out.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        std::fs::read_to_string(&out)
            .unwrap()
            .contains("No loops in this project yet")
    );
}
