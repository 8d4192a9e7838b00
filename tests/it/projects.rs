//! Many projects (DESIGN §15): the registry `loopflow projects add|remove|list` keeps in
//! `$XDG_CONFIG_HOME/loopflow/projects.toml`, and `status`, `report` and `dashboard` over
//! several projects (`--all`, `--project` more than once): loops named `project:loop`,
//! halted first across all, a project that cannot be read listed as broken and hiding
//! nothing.

use std::path::Path;

use serde_json::Value;

use crate::support::{Project, Run, loopflow, standard_agent};

/// A project with loop `ok` ticked once and, when `halted`, loop `stuck` halted by hand.
fn project_with_loops(halted: bool) -> Project {
    let p = Project::new();
    let agent = standard_agent(&p, &[r#"{"pass": false, "score": 0.4}"#]);
    p.agent_loop("ok", &agent, "score_plateau_window = 50");
    assert_eq!(p.lf(&["run", "--loop", "ok"]).code, 0);
    if halted {
        p.agent_loop("stuck", &agent, "");
        assert_eq!(p.lf(&["run", "--loop", "stuck"]).code, 0);
        let r = p.lf(&["halt", "--loop", "stuck", "--reason", "needs a look"]);
        assert_eq!(r.code, 0, "{r:?}");
    }
    p
}

/// The whole stdout as one JSON document (`--json` prints it pretty).
fn doc(r: &Run) -> Value {
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {r:?}"))
}

fn label(p: &Path) -> String {
    p.canonicalize()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// `loopflow ARGS` from `cwd` with the registry under `config` (and no LOOPFLOW_PROJECT).
fn lf_in(cwd: &Path, config: &Path, args: &[&str]) -> Run {
    Run::of(
        loopflow(cwd)
            .env("XDG_CONFIG_HOME", config)
            .env_remove("LOOPFLOW_PROJECT")
            .args(args),
    )
}

#[test]
fn the_registry_is_kept_by_add_remove_and_list() {
    let config = tempfile::tempdir().unwrap();
    let (a, b) = (project_with_loops(false), project_with_loops(true));
    let cfg = config.path();
    // `add` without a directory adds the current project.
    let r = lf_in(a.path(), cfg, &["projects", "add"]);
    assert_eq!(r.code, 0, "{r:?}");
    let r = lf_in(
        a.path(),
        cfg,
        &["projects", "add", b.path().to_str().unwrap()],
    );
    assert_eq!(r.code, 0, "{r:?}");
    // Twice is once.
    let r = lf_in(
        a.path(),
        cfg,
        &["projects", "add", b.path().to_str().unwrap()],
    );
    assert!(r.stdout.contains("nothing to add"), "{r:?}");
    let file = cfg.join("loopflow/projects.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("projects = ["), "{text}");

    let r = lf_in(a.path(), cfg, &["projects", "list", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let j = doc(&r);
    let listed = j["projects"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{j}");
    assert_eq!(listed[0]["label"], label(a.path()).as_str());
    assert_eq!(listed[0]["loops"], 1);
    assert_eq!(listed[1]["loops"], 2);
    assert!(listed[1]["error"].is_null());
    let r = lf_in(a.path(), cfg, &["projects", "list"]);
    assert!(r.stdout.starts_with("PROJECT"), "{r:?}");

    // Removed by label; an unknown one is refused and changes nothing.
    let r = lf_in(a.path(), cfg, &["projects", "remove", "no-such"]);
    assert_eq!(r.code, 2, "{r:?}");
    let r = lf_in(a.path(), cfg, &["projects", "remove", &label(a.path())]);
    assert_eq!(r.code, 0, "{r:?}");
    let r = lf_in(a.path(), cfg, &["projects", "list", "--json"]);
    assert_eq!(doc(&r)["projects"].as_array().unwrap().len(), 1);

    // A registry that does not parse names its file and line; --all says so too.
    std::fs::write(&file, "projects = [\n  3,\n]\n").unwrap();
    let r = lf_in(a.path(), cfg, &["status", "--all"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.stderr.contains(&file.display().to_string()), "{r:?}");
    assert!(r.stderr.contains("line 2"), "{r:?}");
    // `create` offers the registry to a project it does not list, and only then.
    let c = Project::git();
    let r = lf_in(c.path(), cfg, &["create", "--loop", "x", "--task", "t"]);
    // (A registry that does not parse costs `create` nothing, and it offers nothing.)
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!r.stdout.contains("projects add"), "{r:?}");
    std::fs::remove_file(&file).unwrap();
    let r = lf_in(c.path(), cfg, &["create", "--loop", "y", "--task", "t"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("`loopflow projects add`"), "{r:?}");
    assert_eq!(lf_in(c.path(), cfg, &["projects", "add"]).code, 0);
    let r = lf_in(c.path(), cfg, &["create", "--loop", "z", "--task", "t"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!r.stdout.contains("projects add"), "{r:?}");
    std::fs::remove_file(&file).unwrap();
    // An empty registry: --all has nothing to show, and says how to fill it.
    let r = lf_in(a.path(), cfg, &["status", "--all"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("loopflow projects add"), "{r:?}");
}

#[test]
fn status_over_many_projects_names_loops_by_project_and_lists_halted_first() {
    let config = tempfile::tempdir().unwrap();
    let cfg = config.path();
    let (a, b) = (project_with_loops(false), project_with_loops(true));
    let gone = tempfile::tempdir().unwrap();
    let gone_dir = gone.path().join("moved-away");
    std::fs::create_dir(&gone_dir).unwrap();
    // A project whose loops cannot be read: `.loopflow/loops` is a file.
    let bad = Project::new();
    bad.write(".loopflow/loops", "not a directory\n");
    for d in [a.path(), b.path(), &gone_dir, bad.path()] {
        let r = lf_in(a.path(), cfg, &["projects", "add", d.to_str().unwrap()]);
        assert_eq!(r.code, 0, "{r:?}");
    }
    std::fs::remove_dir(&gone_dir).unwrap();
    let (la, lb) = (label(a.path()), label(b.path()));

    let r = lf_in(a.path(), cfg, &["status", "--all", "--json"]);
    // Broken projects are errors of the command (exit 4), and hide nothing.
    assert_eq!(r.code, 4, "{r:?}");
    let j = doc(&r);
    let names: Vec<&str> = j["loops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    let stuck = format!("{lb}:stuck");
    assert_eq!(names[0], stuck, "halted first: {names:?}");
    let mut rest = names[1..].to_vec();
    rest.sort();
    let mut want = vec![format!("{la}:ok"), format!("{lb}:ok")];
    want.sort();
    assert_eq!(rest, want);
    let first = &j["loops"][0];
    assert_eq!(first["project"], lb.as_str());
    assert_eq!(first["loop"], "stuck");
    assert_eq!(
        first["project_dir"].as_str().unwrap(),
        b.path().canonicalize().unwrap().to_str().unwrap()
    );
    let errors = j["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{j}");
    assert!(
        errors
            .iter()
            .all(|e| e["project"].is_string() && e["error"].is_string())
    );
    assert!(
        errors
            .iter()
            .any(|e| e["error"].as_str().unwrap().contains("moved-away")),
        "{j}"
    );

    // The table: the same loops, and a line per broken project.
    let r = lf_in(a.path(), cfg, &["status", "--all"]);
    assert_eq!(r.code, 4);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[0].starts_with("LOOP"), "{r:?}");
    assert!(lines[1].starts_with(&stuck), "{r:?}");
    assert!(lines[1].contains("HALTED"), "{r:?}");
    assert_eq!(r.stdout.matches("broken project: ").count(), 2, "{r:?}");

    // `--project` twice: those two, no registry needed; a loop picked by its full name.
    let r = Run::of(
        loopflow(a.path())
            .env("XDG_CONFIG_HOME", tempfile::tempdir().unwrap().path())
            .args(["--project", a.path().to_str().unwrap()])
            .args(["--project", b.path().to_str().unwrap()])
            .args(["status", "--json", "--loop", &stuck]),
    );
    assert_eq!(r.code, 0, "{r:?}");
    let j = doc(&r);
    assert_eq!(j["loops"].as_array().unwrap().len(), 1, "{j}");
    assert_eq!(j["loops"][0]["name"], stuck.as_str());

    // One project: the output is what it always was (no project keys).
    let r = a.lf(&["status", "--json"]);
    let row = &doc(&r)["loops"][0];
    assert_eq!(row["name"], "ok");
    assert!(
        row.get("project").is_none() && row.get("loop").is_none(),
        "{row}"
    );

    // Other commands take one project.
    let r = Run::of(
        loopflow(a.path())
            .args(["--project", a.path().to_str().unwrap()])
            .args(["--project", b.path().to_str().unwrap()])
            .args(["run", "--loop", "ok"]),
    );
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("more than once"), "{r:?}");
}

#[test]
fn report_over_many_projects_shows_every_loop_and_the_broken_project() {
    let (a, b) = (project_with_loops(false), project_with_loops(true));
    let gone = tempfile::tempdir().unwrap().path().join("gone");
    let out = a.join("all.html");
    let r = Run::of(
        loopflow(a.path())
            .args(["--project", a.path().to_str().unwrap()])
            .args(["--project", b.path().to_str().unwrap()])
            .args(["--project", gone.to_str().unwrap()])
            .args(["report", "--html", out.to_str().unwrap()]),
    );
    assert_eq!(r.code, 0, "{r:?}");
    let html = std::fs::read_to_string(&out).unwrap();
    let (la, lb) = (label(a.path()), label(b.path()));
    for id in [
        format!("{la}:ok"),
        format!("{lb}:ok"),
        format!("{lb}:stuck"),
        "gone:".to_string(),
    ] {
        assert!(html.contains(&format!("id=\"loop-{id}\"")), "no card {id}");
    }
    // Halted first across projects; the commands name the loop's own project.
    let stuck = html.find(&format!("id=\"loop-{lb}:stuck\"")).unwrap();
    let ok = html.find(&format!("id=\"loop-{la}:ok\"")).unwrap();
    assert!(stuck < ok);
    let b_dir = b.path().canonicalize().unwrap();
    let approve = format!(
        "loopflow approve --loop stuck --project {}",
        b_dir.display()
    );
    assert!(html.contains(&approve), "{approve} not in {html}");
    assert!(html.contains("project unreadable"), "{html}");
    // The summary has a chip per project: its loops, its halted ones, or unreadable.
    assert!(
        html.contains(&format!("<b>{lb}</b> 2 loop(s), 1 halted")),
        "{html}"
    );
    assert!(html.contains(&format!("<b>{la}</b> 1 loop(s)")), "{html}");
    assert!(html.contains("<b>gone</b> unreadable"), "{html}");
    assert!(html.contains("3 projects: "), "{html}");
}

/// `status --json`'s loops, by name.
fn names(v: &Value) -> Vec<String> {
    v["loops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_dashboard_over_many_projects_serves_every_project_live() {
    let (a, b) = (project_with_loops(false), project_with_loops(true));
    let (la, lb) = (label(a.path()), label(b.path()));
    let mut d =
        crate::dashboard::Dashboard::start_with(&a, &["--project", b.path().to_str().unwrap()]);
    let (code, _, body) = d.get("/api/status");
    assert_eq!(code, 200);
    let j: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(names(&j)[0], format!("{lb}:stuck"), "{j}");
    assert_eq!(j["projects"].as_array().unwrap().len(), 2, "{j}");
    assert_eq!(j["loops"][0]["project"], lb.as_str());
    // A tick in the second project reaches the stream.
    let (mut events, _) = crate::dashboard::events_of(&d);
    assert_eq!(b.lf(&["run", "--loop", "ok"]).code, 0);
    let key = format!("{lb}:ok");
    let u = crate::dashboard::next_update(&mut events, |v| v["loops"].get(&key).is_some());
    assert!(
        u["order"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == &Value::from(format!("{la}:ok")))
    );
    d.stop();
}
