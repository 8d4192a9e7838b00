//! `loopflow report --html`: the dashboard's page written once, for a human deciding
//! whether to approve. Agent-written text in it must be inert, every loop must be on it
//! (a broken one too, never as "ok"), and numbers must be rounded for people.

use crate::support::{LoopToml, Project, standard_agent};

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
    for raw in ["<script", "<img", "<b>bold"] {
        assert!(!html.contains(raw), "unescaped {raw} in the report");
    }
    assert!(
        html.contains("needs you · &lt;script&gt;alert(1)&lt;/script&gt;"),
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
    // Static: no script, nothing fetched from anywhere.
    assert!(!html.contains("app.js") && !html.contains("http"), "{html}");
    assert!(html.contains("<svg class=\"chart\""), "{html}");
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

/// The `<article>` of loop `name` in `html`.
fn card<'a>(html: &'a str, name: &str) -> &'a str {
    let id = html
        .find(&format!("id=\"loop-{name}\""))
        .unwrap_or_else(|| panic!("no card for {name}"));
    let start = html[..id].rfind("<article").expect("card start");
    let end = html[start..].find("</article>").expect("card end") + start;
    &html[start..end]
}

#[test]
fn every_loop_is_on_the_page_broken_ones_as_broken_and_goal_met_as_good_news() {
    let p = Project::new();
    let agent = standard_agent(
        &p,
        &[r#"{"pass": true, "score": 1.0, "reasons": ["done"], "cost_usd": 0.007145932000000001}"#],
    );
    p.agent_loop("done", &agent, "");
    p.run_json("done", &[]);
    p.agent_loop("fresh", &agent, "");
    // A loop.toml with an unknown key: every tick exits 3.
    p.with_loop(
        "broken",
        &LoopToml::new()
            .harness_agent(&agent)
            .brakes("max_iterashuns = 3"),
    );
    // A loop directory whose state was lost.
    p.agent_loop("lost", &agent, "");
    std::fs::remove_file(p.loop_dir("lost").join(".state.loop")).unwrap();
    // A loop committed but never started (a fresh clone): its loop.toml, no state, no log.
    p.agent_loop("unstarted", &agent, "");
    for f in [".state.loop", ".state.log"] {
        std::fs::remove_file(p.loop_dir("unstarted").join(f)).unwrap();
    }
    let r = p.lf(&["report", "--html", "-"]);
    assert_eq!(r.code, 0, "{r:?}");
    let html = &r.stdout;
    assert_eq!(html.matches("<article class=\"loop").count(), 5, "{html}");
    let unstarted = card(html, "unstarted");
    assert!(unstarted.contains("not started"), "{unstarted}");
    assert!(
        unstarted.contains("loopflow create --loop unstarted"),
        "{unstarted}"
    );
    let broken = card(html, "broken");
    assert!(broken.contains("class=\"loop broken\""), "{broken}");
    assert!(broken.contains("max_iterashuns"), "{broken}");
    assert!(broken.contains("loopflow check"), "{broken}");
    assert!(
        !broken.contains("ready") && !broken.contains(">ok<"),
        "{broken}"
    );
    let lost = card(html, "lost");
    assert!(lost.contains("class=\"loop broken\""), "{lost}");
    assert!(lost.contains("no .state.loop"), "{lost}");
    let done = card(html, "done");
    assert!(done.contains("class=\"badge b-goal\""), "{done}");
    assert!(!done.contains("b-halt"), "{done}");
    assert!(done.contains("$0.0071"), "{done}");
    assert!(!html.contains("0.00714"), "raw floats: {html}");
    // Halted first, then broken, then the rest.
    let at = |n: &str| html.find(&format!("id=\"loop-{n}\"")).unwrap();
    assert!(
        at("done") < at("broken") && at("broken") < at("fresh"),
        "order"
    );
    // The audit counts the goal met; details start collapsed.
    assert!(!html.contains("<details open"), "{html}");
    assert!(
        html.contains("<div class=\"tile d-goal_met\" title=\"goal_met\"><b>1</b>"),
        "{html}"
    );
}

#[test]
fn report_writes_through_devices_and_leaves_readable_files() {
    let p = Project::new();
    let agent = standard_agent(&p, &[r#"{"pass": false, "score": 0.5}"#]);
    p.agent_loop("l", &agent, "");
    // /dev/stdout is a symlink to this process's stdout (a pipe here): written through.
    let r = p.lf(&["report", "--html", "/dev/stdout"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.starts_with("<!doctype html>"), "{r:?}");
    assert!(std::path::Path::new("/dev/stdout").exists());
    let out = p.join("page.html");
    assert_eq!(p.lf(&["report", "--html", out.to_str().unwrap()]).code, 0);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
    // A closed stdout ends `--html -` quietly.
    let mut child = p
        .lf_cmd(&["report", "--html", "-"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(matches!(o.status.code(), Some(0) | Some(141)), "{o:?}");
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("panick"),
        "{o:?}"
    );
}
