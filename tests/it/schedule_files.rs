//! Scheduler files a sysadmin can use as generated: the GitHub workflow installs this
//! loopflow (never the unrelated crates.io crate of the same name) and the loop's agent at
//! pinned versions, gives the agent its API keys from secrets, sets a git identity and a
//! timeout that covers the roles; Kubernetes gets a complete manifest set for a given
//! image, which the repository's Containerfile builds; the systemd timer says it needs
//! lingering on a server; `install` says how often the platform really fires.

use std::path::Path;
use std::process::Command;

use crate::support::{Project, Run, have};

const REPO: &str = "https://git.example.org/loopflow.git";
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A git project with loop `l`; `harness` replaces its `[harness]` agent line.
fn project(harness: Option<&str>) -> Project {
    let p = Project::git();
    let r = p.lf(&["create", "--loop", "l", "--task", "t"]);
    assert_eq!(r.code, 0, "{r:?}");
    if let Some(h) = harness {
        let cfg = p.read(".loopflow/loops/l/loop.toml");
        let cfg: Vec<String> = cfg
            .lines()
            .map(|l| {
                // The template's agent line (`preset = "opencode"`).
                if l.starts_with("preset = ") || l.starts_with("command = ") {
                    h.to_string()
                } else {
                    l.to_string()
                }
            })
            .collect();
        p.write(".loopflow/loops/l/loop.toml", &(cfg.join("\n") + "\n"));
    }
    p
}

fn print(p: &Project, platform: &str, extra: &[&str]) -> Run {
    let mut args = vec!["schedule", "print", "--loop", "l", "--platform", platform];
    args.extend_from_slice(extra);
    p.lf(&args)
}

fn actionlint(text: &str) {
    if !have("actionlint") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("loopflow-l.yml");
    std::fs::write(&f, text).unwrap();
    let out = Command::new("actionlint").arg(&f).output().unwrap();
    assert!(
        out.status.success(),
        "actionlint: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn timeout_minutes(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("timeout-minutes: "))
        .and_then(|n| n.parse().ok())
        .expect("timeout-minutes")
}

#[test]
fn the_workflow_needs_to_know_where_loopflow_comes_from() {
    let p = project(None);
    let r = print(&p, "github-actions", &[]);
    let own = env!("CARGO_PKG_REPOSITORY");
    if own.is_empty() {
        assert_eq!(r.code, 2, "{r:?}");
        assert!(
            r.stderr.contains("--repo URL") && r.stderr.contains("--binary-url"),
            "{r:?}"
        );
        assert!(r.stdout.is_empty(), "{r:?}");
    } else {
        // Without flags: loopflow's own GitHub Action (action.yml) at this version, from
        // the repository Cargo.toml names.
        assert_eq!(r.code, 0, "{r:?}");
        let owner_repo = own.trim_start_matches("https://github.com/");
        assert!(
            r.stdout.contains(&format!(
                "uses: {owner_repo}@v{VERSION}\n        with:\n          command: none\n"
            )),
            "{}",
            r.stdout
        );
        assert!(!r.stdout.contains("cargo install"), "{}", r.stdout);
        actionlint(&r.stdout);
        // `command: none` is one of the Action's commands (scripts/action-run).
        let action =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("action.yml"))
                .expect("action.yml");
        assert!(action.contains("\n  command:\n"), "{action}");
    }
    // The environment works as the flag does.
    let r = p.lf_env(
        &[
            "schedule",
            "print",
            "--loop",
            "l",
            "--platform",
            "github-actions",
        ],
        &[("LOOPFLOW_REPO", REPO)],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains(REPO), "{}", r.stdout);
    // A GitHub repository given by flag is used through its Action.
    let r = print(
        &p,
        "github-actions",
        &["--repo", "https://github.com/someone/loopflow-fork.git"],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout
            .contains(&format!("uses: someone/loopflow-fork@v{VERSION}")),
        "{}",
        r.stdout
    );
}

#[test]
fn the_workflow_installs_this_loopflow_pinned_and_the_agent() {
    let p = project(Some("preset = \"claude-code\""));
    let r = print(&p, "github-actions", &["--repo", REPO]);
    assert_eq!(r.code, 0, "{r:?}");
    let wf = &r.stdout;
    // This project's loopflow, at the running version's tag; never the crates.io crate.
    assert!(
        wf.contains(&format!(
            "run: cargo install --locked --git \"$REPO\" --tag \"v{VERSION}\" loopflow-cli\n"
        )),
        "{wf}"
    );
    assert!(wf.contains(&format!("REPO: \"{REPO}\"")), "{wf}");
    assert!(!wf.contains("cargo install --locked loopflow\n"), "{wf}");
    // The agent its preset runs, pinned, with its key from the repository's secrets.
    assert!(
        wf.contains("run: npm install -g @anthropic-ai/claude-code@2."),
        "{wf}"
    );
    assert!(
        wf.contains("ANTHROPIC_API_KEY: ${{ secrets.ANTHROPIC_API_KEY }}"),
        "{wf}"
    );
    // A git identity for commits on the loop's branch.
    assert!(
        wf.contains("git config user.name \"github-actions[bot]\""),
        "{wf}"
    );
    // Three roles of 45 minutes each fit in the job, with room for the installs.
    let t = timeout_minutes(wf);
    assert!((3 * 45..=360).contains(&t), "timeout-minutes: {t}");
    actionlint(wf);

    // A role with another agent: both installed, both keys given; an extra secret too.
    let cfg = p.read(".loopflow/loops/l/loop.toml");
    p.write(
        ".loopflow/loops/l/loop.toml",
        &cfg.replace(
            "[roles.verify]\n",
            "[roles.verify]\npreset = \"codex\"\ntimeout = \"2h\"\n",
        ),
    );
    let r = print(
        &p,
        "github-actions",
        &["--repo", REPO, "--secret", "EXTRA_TOKEN"],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let wf = &r.stdout;
    assert!(
        wf.contains("@anthropic-ai/claude-code@2.") && wf.contains("@openai/codex@0."),
        "{wf}"
    );
    for key in ["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "EXTRA_TOKEN"] {
        assert!(
            wf.contains(&format!("{key}: ${{{{ secrets.{key} }}}}")),
            "{key}: {wf}"
        );
    }
    assert!(timeout_minutes(wf) >= 45 + 120 + 45, "{wf}");
    actionlint(wf);
    assert_eq!(
        print(
            &p,
            "github-actions",
            &["--repo", REPO, "--secret", "no-dash"]
        )
        .code,
        2
    );
}

#[test]
fn the_workflow_can_install_a_released_binary() {
    let p = project(None);
    let url = "https://dl.example.org/loopflow-x86_64-linux.tar.gz";
    let r = print(
        &p,
        "github-actions",
        &["--binary-url", url, "--binary-sha256", "0123abcd"],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let wf = &r.stdout;
    assert!(wf.contains(&format!("URL: \"{url}\"")), "{wf}");
    assert!(
        wf.contains("sha256sum -c -") && wf.contains("0123abcd"),
        "{wf}"
    );
    assert!(!wf.contains("cargo install"), "{wf}");
    // The default harness runs opencode: installed, and the keys it may need are given.
    assert!(wf.contains("npm install -g opencode-ai@1."), "{wf}");
    assert!(
        wf.contains("OPENAI_API_KEY: ${{ secrets.OPENAI_API_KEY }}"),
        "{wf}"
    );
    actionlint(wf);
}

#[test]
fn an_agent_loopflow_cannot_install_is_checked_for_not_ignored() {
    let p = project(Some("command = [\"my-agent\", \"{{prompt}}\"]"));
    let r = print(&p, "github-actions", &["--repo", REPO]);
    assert_eq!(r.code, 0, "{r:?}");
    let wf = &r.stdout;
    assert!(wf.contains("AGENT: \"my-agent\""), "{wf}");
    assert!(wf.contains("::error::loop l runs $AGENT"), "{wf}");
    // With no agent timeout, the job gets GitHub's own limit.
    let cfg = p.read(".loopflow/loops/l/loop.toml");
    p.write(
        ".loopflow/loops/l/loop.toml",
        &cfg.replace("timeout = \"45m\"\n", ""),
    );
    let r = print(&p, "github-actions", &["--repo", REPO]);
    assert_eq!(timeout_minutes(&r.stdout), 360, "{}", r.stdout);
    actionlint(&r.stdout);
}

#[test]
fn install_says_how_often_github_really_runs() {
    let p = project(None);
    let cfg = p
        .read(".loopflow/loops/l/loop.toml")
        .replace("interval_seconds = 3600", "interval_seconds = 2");
    p.write(".loopflow/loops/l/loop.toml", &cfg);
    let r = p.lf(&[
        "schedule",
        "install",
        "--loop",
        "l",
        "--platform",
        "github-actions",
        "--repo",
        REPO,
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("on cron `*/5 * * * *` (every 5 min)"),
        "{r:?}"
    );
    assert!(!r.stdout.contains("every 2 s"), "{r:?}");
    assert!(
        p.events("l")
            .iter()
            .any(|e| e == "SCHEDULE installed=github-actions every=300s"),
        "{:?}",
        p.events("l")
    );
}

#[test]
fn kubernetes_needs_an_image_and_gets_a_complete_manifest_set() {
    let p = project(Some("preset = \"gemini\""));
    let r = print(&p, "kubernetes", &[]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("--image IMAGE") && r.stderr.contains("Containerfile"),
        "{r:?}"
    );
    assert_eq!(print(&p, "systemd", &["--image", "x"]).code, 2);
    let r = print(&p, "kubernetes", &["--image", "registry.example.org/lf:1"]);
    assert_eq!(r.code, 0, "{r:?}");
    let k = &r.stdout;
    assert!(
        k.contains("kind: PersistentVolumeClaim\nmetadata:\n  name: loopflow-l-project"),
        "{k}"
    );
    assert!(k.contains("claimName: loopflow-l-project"), "{k}");
    assert!(k.contains("image: \"registry.example.org/lf:1\""), "{k}");
    assert!(
        k.contains("- name: GEMINI_API_KEY\n                  valueFrom:\n                    secretKeyRef:\n                      name: loopflow-l-agent\n                      key: GEMINI_API_KEY"),
        "{k}"
    );
    assert!(
        k.contains("kubectl create secret generic loopflow-l-agent --from-literal=GEMINI_API_KEY="),
        "{k}"
    );
    assert!(
        k.contains("concurrencyPolicy: Forbid") && k.contains("startingDeadlineSeconds:"),
        "{k}"
    );
    // The pod runs as the user the Containerfile creates.
    let containerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Containerfile"))
            .expect("Containerfile");
    assert!(k.contains("runAsUser: 10001"), "{k}");
    assert!(containerfile.contains("--uid 10001") && containerfile.contains("USER 10001"));
    // An agent loopflow knows no keys of gets the whole Secret, optional.
    let cfg = p.read(".loopflow/loops/l/loop.toml");
    p.write(
        ".loopflow/loops/l/loop.toml",
        &cfg.replace(
            "preset = \"gemini\"",
            "command = [\"my-agent\", \"{{prompt}}\"]",
        ),
    );
    let r = print(&p, "kubernetes", &["--image", "registry.example.org/lf:1"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("envFrom:\n                - secretRef:\n                    name: loopflow-l-agent\n                    optional: true"),
        "{}",
        r.stdout
    );
    if have("kubernetes-validate") {
        for text in [k.as_str(), r.stdout.as_str()] {
            let dir = tempfile::tempdir().unwrap();
            let f = dir.path().join("k.yaml");
            std::fs::write(&f, text).unwrap();
            let out = Command::new("kubernetes-validate")
                .arg("--strict")
                .arg(&f)
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && said.matches("passed").count() == 2,
                "{said}"
            );
        }
    }
}

/// The Containerfile the manifests name: a Rust build stage, then a slim runtime with git,
/// judged by hadolint (CI installs it).
#[test]
fn the_containerfile_builds_the_image_the_manifests_name() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("Containerfile")).expect("Containerfile");
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    assert!(
        froms[0].contains("rust:") && froms[0].ends_with(" AS build"),
        "{froms:?}"
    );
    assert!(text.contains("cargo build --release --locked"), "{text}");
    assert!(text.contains("install -y --no-install-recommends ca-certificates git"));
    assert!(text.contains("ENTRYPOINT [\"loopflow\"]"));
    // The build context leaves out build output and local state.
    let ignore = std::fs::read_to_string(root.join(".dockerignore")).expect(".dockerignore");
    assert!(ignore.lines().any(|l| l == "target/"), "{ignore}");
    if !have("hadolint") {
        return;
    }
    let out = Command::new("hadolint")
        .arg("--no-color")
        .arg(root.join("Containerfile"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hadolint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_systemd_timer_says_it_needs_lingering_on_a_server() {
    let p = project(None);
    let r = print(&p, "systemd", &[]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("loginctl enable-linger $USER"),
        "{}",
        r.stdout
    );
}
