//! `loopflow drift --check`: exit 1 when a doc drifted from the code it describes, 0 when
//! every doc is in sync, so CI can fail on drift; without `--check`, exit 0 either way.

use crate::support::Project;

#[test]
fn drift_check_fails_on_drift_and_passes_in_sync() {
    let p = Project::git();
    p.write("src/a.rs", "fn a() {}\n");
    p.commit_all("code");
    let sha = p.git_cmd(&["rev-parse", "HEAD"]).trim().to_string();
    p.write(
        "docs/a.md",
        &format!("# A\n<!-- describes: src/a.rs -->\n<!-- last-read-sha: {sha} -->\n"),
    );
    p.commit_all("docs");
    let repo = p.path().to_str().expect("utf-8").to_string();
    let drift = |check: bool| {
        let mut args = vec!["drift", "--repo", &repo, "--dir", "docs"];
        if check {
            args.push("--check");
        }
        p.lf(&args)
    };
    let r = drift(true);
    assert_eq!((r.code, r.stdout.as_str()), (0, ""), "{r:?}");

    p.write("src/a.rs", "fn a() { changed() }\n");
    p.commit_all("change the code");
    let r = drift(true);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stdout.contains("\"id\":\"docs/a.md\""), "{r:?}");
    assert!(r.stderr.contains("1 doc(s) drifted"), "{r:?}");
    // Without --check it is a task list: exit 0.
    let r = drift(false);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("docs/a.md"), "{r:?}");
    // Not a git tree: a usage error, not "drifted".
    let plain = Project::new();
    let r = plain.lf(&[
        "drift",
        "--repo",
        plain.path().to_str().expect("utf-8"),
        "--check",
    ]);
    assert_eq!(r.code, 2, "{r:?}");
}
