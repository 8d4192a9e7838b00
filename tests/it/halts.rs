//! Every halt, whatever its cause, goes through one halt path: the loop halts, the log
//! says `HALT <reason>`, and an installed schedule is switched off (`SCHEDULE
//! disabled=…`). One test per cause, each with a cron schedule installed through a fake
//! `crontab` on PATH.

use std::path::Path;

use crate::support::{LoopToml, PipelineToml, Project, Run, standard_agent};

/// A fake `crontab` keeping its table in a file next to it.
fn fake_crontab(dir: &Path) {
    let f = dir.join("crontab.txt");
    let script = dir.join("crontab");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nf=\"{}\"\ncase \"$1\" in\n  -l) [ -f \"$f\" ] || {{ echo 'no crontab' >&2; exit 1; }}; cat \"$f\" ;;\n  -) cat > \"$f\" ;;\n  *) exit 2 ;;\nesac\n",
            f.display()
        ),
    )
    .expect("write crontab");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

struct Setup {
    p: Project,
    fakes: tempfile::TempDir,
}

impl Setup {
    /// Loop `l` on the standard fake agent, then `edit` on its loop.toml, then a cron
    /// schedule installed.
    fn new(verdicts: &[&str], brakes: &str) -> Setup {
        let p = Project::new();
        let agent = standard_agent(&p, verdicts);
        p.agent_loop("l", &agent, brakes);
        Setup::install(p)
    }

    fn install(p: Project) -> Setup {
        let fakes = tempfile::tempdir().expect("tempdir");
        fake_crontab(fakes.path());
        let s = Setup { p, fakes };
        let r = s.lf(&["schedule", "install", "--loop", "l", "--platform", "cron"]);
        assert_eq!(r.code, 0, "{r:?}");
        assert!(
            s.crontab().contains("'run' '--loop' 'l'"),
            "{}",
            s.crontab()
        );
        s
    }

    fn lf(&self, args: &[&str]) -> Run {
        let path = format!(
            "{}:{}",
            self.fakes.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        self.p.lf_env(args, &[("PATH", &path)])
    }

    fn crontab(&self) -> String {
        std::fs::read_to_string(self.fakes.path().join("crontab.txt")).unwrap_or_default()
    }

    fn tick(&self) -> Run {
        let r = self.lf(&["run", "--loop", "l", "--json"]);
        assert_eq!(r.code, 0, "{r:?}");
        r
    }

    /// Ticks until the loop halts (at most `max` ticks); then checks the halt reason, the
    /// HALT line and that the schedule was switched off right after it.
    fn halts_with(&self, reason: &str, max: usize) {
        for _ in 0..max {
            if self.tick().json()["outcome"] == "halt" {
                break;
            }
        }
        let s = self.p.state("l");
        assert_eq!(s["halt"]["reason"], reason, "{s}");
        assert_halt_disabled(&self.p, reason);
        assert!(
            self.crontab().contains("#halted# "),
            "the cron entry stays on: {}",
            self.crontab()
        );
    }
}

/// The log has `HALT <reason>` followed by `SCHEDULE disabled=true platform=cron`.
fn assert_halt_disabled(p: &Project, reason: &str) {
    let events = p.events("l");
    let at = events
        .iter()
        .position(|e| e == &format!("HALT {reason}") || e.starts_with(&format!("HALT {reason} ")))
        .unwrap_or_else(|| panic!("no HALT {reason}: {events:#?}"));
    assert!(
        events[at..]
            .iter()
            .any(|e| e == "SCHEDULE disabled=true platform=cron"),
        "no SCHEDULE disabled after HALT {reason}: {events:#?}"
    );
}

const PASS_HALF: &str = r#"{"pass": false, "score": 0.5}"#;

#[test]
fn goal_met_disables_the_schedule() {
    Setup::new(&[r#"{"pass": true, "score": 1.0}"#], "").halts_with("goal_met", 1);
}

#[test]
fn iterations_exhausted_disables_the_schedule() {
    Setup::new(&[PASS_HALF], "max_iterations = 1").halts_with("iterations_exhausted", 2);
}

#[test]
fn budget_exhausted_disables_the_schedule() {
    Setup::new(
        &[r#"{"pass": false, "score": 0.5, "cost_usd": 0.5}"#],
        "max_budget_usd = 0.1",
    )
    .halts_with("budget_exhausted:usd", 2);
}

#[test]
fn unparseable_verdict_disables_the_schedule() {
    Setup::new(&["no verdict here"], "").halts_with("verifier_failed:unparseable", 1);
}

#[test]
fn score_plateau_disables_the_schedule() {
    Setup::new(&[PASS_HALF], "score_plateau_window = 1")
        .halts_with("verifier_failed:score_plateau", 2);
}

#[test]
fn context_below_floor_disables_the_schedule() {
    Setup::new(&[PASS_HALF], "context_tokens = 1000")
        .halts_with("human_intervention:context_below_floor", 1);
}

#[test]
fn harness_failing_disables_the_schedule() {
    let p = Project::new();
    let agent = p.script("agent.sh", "exit 1");
    p.agent_loop("l", &agent, "max_consecutive_aborts = 1");
    Setup::install(p).halts_with("human_intervention:harness_failing", 1);
}

#[test]
fn state_tampered_disables_the_schedule() {
    let p = Project::new();
    let state = p.join(".loopflow/loops/l/.state.loop");
    let agent = p.script(
        "agent.sh",
        &format!(
            r#"case "$1" in
  implement) sed -i 's/"extra_iterations": 0/"extra_iterations": 99/' "{s}" ;;
  verify) echo '{{"pass": false, "score": 0.5}}' ;;
esac"#,
            s = state.display()
        ),
    );
    p.agent_loop("l", &agent, "");
    Setup::install(p).halts_with("human_intervention:state_tampered", 1);
}

#[test]
fn config_changed_disables_the_schedule() {
    let p = Project::new();
    let cfg = p.join(".loopflow/loops/l/loop.toml");
    let agent = p.script(
        "agent.sh",
        &format!(
            r#"case "$1" in
  implement) echo '# raised by the agent' >> "{c}" ;;
  verify) echo '{{"pass": false, "score": 0.5}}' ;;
esac"#,
            c = cfg.display()
        ),
    );
    p.agent_loop("l", &agent, "");
    Setup::install(p).halts_with("human_intervention:config_changed", 1);
}

#[test]
fn node_failed_disables_the_schedule() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS_HALF]);
    let pipeline = PipelineToml::new()
        .node("gate", "gate", &[])
        .command("tests", &["false"], &["gate"])
        .with("on_failure = \"halt\"")
        .commit("commit", &["tests"]);
    let file = p.write("pipeline.toml", &pipeline.render());
    p.with_loop("l", &LoopToml::new().harness_agent(&agent).pipeline(&file));
    Setup::install(p).halts_with("human_intervention:node_failed", 1);
}

#[test]
fn blast_radius_disables_the_schedule() {
    let p = Project::git();
    let agent = p.script(
        "agent.sh",
        r#"case "$1" in
  implement) echo x > outside.txt ;;
  verify) echo '{"pass": false, "score": 0.5}' ;;
esac"#,
    );
    let pipeline = PipelineToml::new()
        .node("gate", "gate", &[])
        .harness("implement", "implement", &["gate"])
        .commit("commit", &["implement"])
        .git_commit("land", &["commit"]);
    let file = p.write("pipeline.toml", &pipeline.render());
    p.with_loop(
        "l",
        &LoopToml::new()
            .harness_agent(&agent)
            .pipeline(&file)
            .worktree(true)
            .blast_radius(&["src/**"], &[]),
    );
    Setup::install(p).halts_with("human_intervention:blast_radius", 1);
}

#[test]
fn a_human_halt_disables_the_schedule() {
    let s = Setup::new(&[PASS_HALF], "");
    let r = s.lf(&["halt", "--loop", "l", "--reason", "lunch"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_halt_disabled(&s.p, "lunch");
}
