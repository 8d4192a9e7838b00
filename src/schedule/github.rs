//! A GitHub Actions workflow with `schedule:` and a `concurrency:` group that never
//! cancels a running tick. A hosted runner is a fresh machine, so the workflow installs
//! this loopflow (through loopflow's GitHub Action at the running version, from another
//! git repository at that tag, or a released binary; never `cargo install loopflow`, which
//! is an unrelated crate on crates.io) and
//! the agents the loop's roles run, at pinned versions; it gives the agents their API
//! keys from the repository's secrets, sets a git identity, and a job timeout that covers
//! every role's timeout.

use super::agents::{AgentUse, Install};
use super::cron::cron_schedule;
use super::{File, LoopflowInstall, Target};

/// YAML double-quoted scalar (JSON strings are valid YAML).
pub(super) fn yq(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// GitHub-hosted runners stop a job after 6 hours whatever it asks for.
pub(super) const GITHUB_MAX_MINUTES: u64 = 360;

/// The job's `timeout-minutes`, and a comment saying where it comes from.
fn job_timeout(t: &Target) -> (u64, String) {
    let install = match t.remote.install {
        Some(LoopflowInstall::Git { .. }) => 20, // a cold `cargo install` builds from source
        _ => 5,
    };
    let agents = if t.remote.agents.iter().any(|a| a.known().is_some()) {
        5
    } else {
        0
    };
    let margin = 10 + install + agents;
    match t.remote.tick_limit {
        None => (
            GITHUB_MAX_MINUTES,
            "# timeout-minutes: GitHub's limit, since a node of the tick has no timeout of its own.\n"
                .into(),
        ),
        Some(d) => {
            let tick = d.as_secs().div_ceil(60);
            let want = tick + margin;
            if want > GITHUB_MAX_MINUTES {
                (
                    GITHUB_MAX_MINUTES,
                    format!(
                        "# timeout-minutes: the tick's timeouts add up to {tick} min, more than GitHub's {GITHUB_MAX_MINUTES}-minute job limit; lower the role timeouts.\n"
                    ),
                )
            } else {
                (
                    want,
                    format!(
                        "# timeout-minutes: the tick's timeouts (every node's timeout times its tries) add up to {tick} min, plus {margin} min for the installs and the rest.\n"
                    ),
                )
            }
        }
    }
}

/// The steps that install loopflow.
pub(super) fn install_loopflow(t: &Target, cache: bool) -> String {
    let v = env!("CARGO_PKG_VERSION");
    match &t.remote.install {
        Some(LoopflowInstall::Action { uses }) => format!(
            r#"      - name: Install loopflow
        # loopflow's GitHub Action at the version that generated this workflow: the
        # released binary for the runner, checked against its SHA-256.
        uses: {uses}
        with:
          command: none
"#
        ),
        Some(LoopflowInstall::Binary { url, sha256 }) => {
            let check = match sha256 {
                Some(h) => format!(
                    "          echo \"{h}  $RUNNER_TEMP/loopflow.download\" | sha256sum -c -\n"
                ),
                None => String::new(),
            };
            format!(
                r#"      - name: Install loopflow
        # A released binary of loopflow {v}.
        env:
          URL: {url}
        run: |
          curl -fsSL --retry 3 -o "$RUNNER_TEMP/loopflow.download" "$URL"
{check}          mkdir -p "$HOME/.local/bin" "$RUNNER_TEMP/loopflow.unpacked"
          case "$URL" in
            *.tar.gz|*.tgz)
              tar -xzf "$RUNNER_TEMP/loopflow.download" -C "$RUNNER_TEMP/loopflow.unpacked"
              bin="$(find "$RUNNER_TEMP/loopflow.unpacked" -type f -name loopflow | head -n 1)"
              ;;
            *) bin="$RUNNER_TEMP/loopflow.download" ;;
          esac
          install -m 0755 "$bin" "$HOME/.local/bin/loopflow"
          echo "$HOME/.local/bin" >> "$GITHUB_PATH"
"#,
                url = yq(url),
            )
        }
        Some(LoopflowInstall::Git { repo }) if !cache => format!(
            r#"      - name: Install loopflow
        # This project's loopflow at the version that generated the workflow (the crate
        # named loopflow on crates.io is another program). Built every run: a released
        # binary (--binary-url) or loopflow's Action installs in seconds.
        env:
          REPO: {repo}
        run: cargo install --locked --git "$REPO" --tag "v{v}" loopflow-cli
"#,
            repo = yq(repo),
        ),
        Some(LoopflowInstall::Git { repo }) => format!(
            r#"      - name: Cache loopflow
        id: loopflow-bin
        uses: actions/cache@v5
        with:
          path: ~/.cargo/bin/loopflow
          key: loopflow-{v}-{hash:08x}-${{{{ runner.os }}}}
      - name: Install loopflow
        # This project's loopflow at the version that generated the workflow (the crate
        # named loopflow on crates.io is another program).
        if: steps.loopflow-bin.outputs.cache-hit != 'true'
        env:
          REPO: {repo}
        run: cargo install --locked --git "$REPO" --tag "v{v}" loopflow-cli
"#,
            hash = super::fnv32(std::path::Path::new(repo)),
            repo = yq(repo),
        ),
        // The command line refuses this before rendering; keep the file honest anyway.
        None => "      - name: Install loopflow\n        run: |\n          echo \"::error::no source for loopflow was given (schedule print --repo URL or --binary-url URL)\"\n          exit 1\n".to_string(),
    }
}

/// The steps that install (or check for) the agents the roles run.
pub(super) fn install_agents(t: &Target, loop_name: &str, when: &str) -> String {
    let mut npm = Vec::new();
    let mut pipx = Vec::new();
    let mut out = String::new();
    let mut notes = String::new();
    for a in &t.remote.agents {
        match (a, a.known().map(|k| &k.install)) {
            (_, Some(Install::Npm(p))) => npm.push(p.as_str()),
            (_, Some(Install::Pipx(p))) => pipx.push(p.as_str()),
            (_, Some(Install::Manual(why))) => {
                let program = a.known().map_or("", |k| k.program.as_str());
                out.push_str(&check_program(program, loop_name, why, when));
            }
            (AgentUse::Program(p), None) => out.push_str(&check_program(
                p,
                loop_name,
                "loopflow does not know how to install it; add a step that does",
                when,
            )),
            (AgentUse::Path(p), None) if p.starts_with('/') => notes.push_str(&format!(
                "        # The loop runs {p}, a path on the machine that generated this workflow:\n        # a fresh runner does not have it (use a path in the repository, or a preset).\n"
            )),
            _ => {} // a program in the repository: the checkout brings it
        }
    }
    if !npm.is_empty() {
        out.push_str(&format!(
            "      - name: Install the agent\n{when}        run: npm install -g {}\n",
            npm.join(" ")
        ));
    }
    if !pipx.is_empty() {
        out.push_str(&format!(
            "      - name: Install the agent (Python)\n{when}        run: pipx install {}\n",
            pipx.join(" ")
        ));
    }
    if !notes.is_empty() {
        out.push_str(&format!(
            "      - name: Agent\n{when}{notes}        run: echo \"the agent is not installed by this workflow\"\n"
        ));
    }
    out
}

/// A step that fails clearly when a program the loop runs is not on the runner.
fn check_program(program: &str, loop_name: &str, why: &str, when: &str) -> String {
    format!(
        r#"      - name: Check the agent
{when}        env:
          AGENT: {p}
        run: |
          command -v "$AGENT" >/dev/null || {{
            echo "::error::loop {loop_name} runs $AGENT, which is not on this runner: {why}"
            exit 1
          }}
"#,
        p = yq(program),
    )
}

/// Where `project` sits in its repository: `git rev-parse --show-prefix` (`""` at the
/// top, else `"sub/dir/"`), and why the workflow cannot use it, when it cannot. Only plain
/// names are written into the YAML and its shell steps (no quoting to get wrong); a
/// project outside any repository is at the top of the checkout as far as the workflow
/// knows.
pub(super) fn repo_prefix(project: &std::path::Path) -> (String, Option<String>) {
    let prefix = crate::git::Repo::checkout(project)
        .ok()
        .flatten()
        .and_then(|r| r.prefix_of(project))
        .unwrap_or_default();
    // No segment may start with `-`: it would read as an option to `git worktree add`.
    let plain = prefix
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
        && prefix.split('/').all(|seg| !seg.starts_with('-'));
    if plain {
        (prefix, None)
    } else {
        (
            String::new(),
            Some(
                "the project's path in the repository has characters this generated workflow does not quote (only letters, digits and . _ - / are written into it): move the project, or edit the workflow's paths by hand"
                    .to_string(),
            ),
        )
    }
}

/// A GitHub Actions workflow. The runner is fresh every time, so the loop's state (which
/// is git-ignored) travels in the Actions cache and the loop's branch is pushed back.
pub(super) fn github_actions(t: &Target) -> File {
    let c = cron_schedule(t.interval.max(300));
    let n = &t.loop_name;
    // The project may be a subdirectory of the repository (a monorepo): paths in the
    // workflow are relative to the checkout, loopflow is pointed at the project.
    let (rel, rel_problem) = repo_prefix(&t.project);
    let dir = format!("{rel}.loopflow/loops/{n}");
    // Two projects of one repository may both have a loop `l`: the workflow file, its
    // concurrency group and its cache keys carry the project's place (`services-api-l`).
    let id = match rel.trim_end_matches('/') {
        "" => n.to_string(),
        r => format!("{}-{n}", r.replace('/', "-")),
    };
    let project = match rel.trim_end_matches('/') {
        "" => "$GITHUB_WORKSPACE".to_string(),
        r => format!("$GITHUB_WORKSPACE/{r}"),
    };
    let rel_check = match rel_problem {
        None => String::new(),
        Some(why) => format!(
            "      - name: Check the project directory\n        run: |\n          echo \"::error::{why}\"\n          exit 1\n"
        ),
    };
    let note = match c.note {
        Some(n) => format!("# note: {n} (GitHub runs schedules at most every 5 min)\n"),
        None if t.interval < 300 => {
            "# note: GitHub runs schedules at most every 5 min\n".to_string()
        }
        None => String::new(),
    };
    let expr = c.expr;
    let (timeout, timeout_note) = job_timeout(t);
    let secrets = t.remote.secrets();
    let (secrets_note, secrets_env) = if secrets.is_empty() {
        (String::new(), String::new())
    } else {
        (
            format!(
                "# The agents read their API keys from the repository's secrets: {} (Settings →\n# Secrets and variables → Actions). A secret that is not set is empty.\n",
                secrets.join(", ")
            ),
            secrets
                .iter()
                .map(|s| format!("          {s}: ${{{{ secrets.{s} }}}}\n"))
                .collect(),
        )
    };
    let install = install_loopflow(t, true);
    let agents = install_agents(t, n, "");
    let text = format!(
        r#"# loopflow: tick loop {n} on a schedule (generated by `loopflow schedule print --platform github-actions`).
# The loop's state is git-ignored, so it travels in the Actions cache between runs, and
# the loop's branch loopflow/{n} is pushed back after each tick. Start the loop with a
# manual run ("Run workflow") giving the task; clear a halt with a manual run and
# "approve" ticked (recorded as approved by you).
# note: a cache can be evicted or raced; with the loop's state in its repository
# (`loopflow create --loop {n} --remote origin`, then print this again) every run
# ticks each slot at most once and a halt waits for a human's approval.
{secrets_note}{note}{timeout_note}name: loopflow {rel}{n}

on:
  schedule:
    - cron: "{expr}"
  workflow_dispatch:
    inputs:
      task:
        description: The task (only used on the loop's first run)
        type: string
        required: false
      approve:
        description: Clear the loop's halt before ticking (a human decision, recorded)
        type: boolean
        default: false
      note:
        description: Note recorded with the approval
        type: string
        required: false

# One tick at a time; a queued tick waits and a running one is never cancelled.
concurrency:
  group: loopflow-{id}
  cancel-in-progress: false

permissions:
  contents: write

jobs:
  tick:
    runs-on: ubuntu-latest
    timeout-minutes: {timeout}
    steps:
      - uses: actions/checkout@v5
        with:
          fetch-depth: 0
      - name: Set a git identity
        # For commits on the loop's branch, the agent's own included.
        run: |
          git config user.name "github-actions[bot]"
          git config user.email "41898282+github-actions[bot]@users.noreply.github.com"
      - name: Restore loop state
        uses: actions/cache/restore@v5
        with:
          path: |
            {dir}/.state.loop
            {dir}/.state.log
          key: loopflow-{id}-${{{{ github.run_id }}}}
          restore-keys: loopflow-{id}-
{rel_check}{install}{agents}      - name: Restore the loop's branch
        run: git fetch origin "loopflow/{n}:loopflow/{n}" || git branch "loopflow/{n}"
      - name: Start the loop (first run)
        if: hashFiles('{dir}/.state.loop') == ''
        env:
          TASK: ${{{{ inputs.task }}}}
        # The committed loop.toml and prompts are started as they are.
        run: |
          if [ -n "$TASK" ]; then loopflow --project "{project}" create --loop {n} --task "$TASK"; else loopflow --project "{project}" create --loop {n}; fi
      - name: Restore the loop's worktree
        run: |
          if [ ! -e "{dir}/worktree/.git" ]; then git worktree add "{dir}/worktree" "loopflow/{n}"; fi
      - name: Approve
        if: inputs.approve
        env:
          ACTOR: ${{{{ github.actor }}}}
          NOTE: ${{{{ inputs.note }}}}
        run: loopflow --project "{project}" approve --loop {n} --by "$ACTOR" --note "$NOTE"
      - name: Tick
{tick_env}        run: loopflow run --loop {n} --project "{project}"
      - name: Push the loop's branch
        run: git push origin "loopflow/{n}"
      - name: Save loop state
        if: always()
        uses: actions/cache/save@v5
        with:
          path: |
            {dir}/.state.loop
            {dir}/.state.log
          key: loopflow-{id}-${{{{ github.run_id }}}}
"#,
        tick_env = if secrets_env.is_empty() {
            String::new()
        } else {
            format!("        env:\n{secrets_env}")
        },
    );
    File {
        name: format!("loopflow-{id}.yml"),
        text,
    }
}

/// Where GitHub reads workflows for `project`: `.github/workflows` at the top of its
/// repository (a project in a subdirectory included), or in the project outside one.
pub(super) fn workflows_dir(project: &std::path::Path) -> std::path::PathBuf {
    crate::git::toplevel(project)
        .unwrap_or_else(|| project.to_path_buf())
        .join(".github")
        .join("workflows")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::tests::target;
    use std::time::Duration;

    /// A project's place in its repository: `sub/dir/` when plain, the top (with a reason
    /// the workflow fails on) when its path would need quoting.
    #[test]
    fn the_project_is_found_inside_its_repository() {
        let repo = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("git")
            .args(["init", "-q"])
            .current_dir(repo.path())
            .status()
            .unwrap();
        assert!(ok.success());
        let plain = repo.path().join("services/api-2.x");
        let odd = repo.path().join("it's $HOME");
        std::fs::create_dir_all(&plain).unwrap();
        std::fs::create_dir_all(&odd).unwrap();
        assert_eq!(repo_prefix(repo.path()), (String::new(), None));
        assert_eq!(repo_prefix(&plain), ("services/api-2.x/".to_string(), None));
        let (rel, why) = repo_prefix(&odd);
        assert_eq!(rel, "");
        assert!(why.is_some_and(|w| w.contains("does not quote")));
        // Outside any repository: the top of the checkout.
        let bare = tempfile::tempdir().unwrap();
        assert_eq!(repo_prefix(bare.path()), (String::new(), None));
    }

    #[test]
    fn the_timeout_covers_every_role() {
        let mut t = target();
        t.remote.install = Some(LoopflowInstall::Git {
            repo: "https://x/y".into(),
        });
        t.remote.tick_limit = Some(Duration::from_secs(3 * 45 * 60));
        assert_eq!(job_timeout(&t).0, 135 + 30);
        t.remote.tick_limit = None;
        assert_eq!(job_timeout(&t).0, 360);
        t.remote.tick_limit = Some(Duration::from_secs(10 * 3600));
        assert_eq!(job_timeout(&t).0, 360);
    }
}
