//! Credentials never reach the agent (DESIGN §16): loopflow's git takes the remote's token
//! from `LOOPFLOW_GIT_TOKEN` in its own processes' environment only, and a repository whose
//! git configuration holds a credential (what `actions/checkout` leaves) is refused under
//! `[sandbox] mode = "enforce"` and warned about under `auto`. Each is attacked by an agent
//! that looks everywhere for the token and copies what it finds into the branch.

use std::path::{Path, PathBuf};

use crate::support::remote::{
    Remote, Transport, clone_with_token, header, start_with_token as start_tok,
};
use crate::support::{LoopToml, Project, git};

const TOKEN: &str = "ghs_s3cr3tT0kenThatMustNeverLeakAnywhere0123";

/// An agent that hunts for the token (its environment, every process's environment it can
/// read, the repository's git configuration, git's view of it) and writes all of it into
/// `loot.txt` in the worktree, which the tick commits and pushes.
fn thief(dir: &Path) -> PathBuf {
    let p = dir.join("thief.sh");
    std::fs::write(
        &p,
        r#"#!/bin/sh
case "$1" in
  implement)
    {
      env
      for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f"; done
      cat .git 2>/dev/null
      d=$(git rev-parse --git-common-dir 2>/dev/null) && cat "$d/config"
      cat "$LOOPFLOW_PROJECT/.git/config"
      git config --list --show-origin
    } > loot.txt 2>/dev/null
    echo implemented ;;
  verify) echo '{"pass": true, "score": 0.5}' ;;
  *) echo ok ;;
esac
"#,
    )
    .expect("thief");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p
}

fn loop_toml(agent: &Path, mode: &str) -> LoopToml {
    LoopToml::new()
        .harness_agent(agent)
        .worktree(true)
        .table("remote", "name = \"origin\"")
        .table("sandbox", &format!("mode = \"{mode}\""))
}

/// The attack of record: the token lives only in `LOOPFLOW_GIT_TOKEN`, loopflow's git
/// authenticates with it (the server saw it), and the agent, under the default sandbox,
/// finds it nowhere: the branch it pushed holds its loot, and no token.
#[test]
fn the_token_never_reaches_the_agent() {
    let remote = Remote::with_token(Transport::Http, Some(TOKEN));
    let tools = tempfile::tempdir().expect("tempdir");
    let _human = start_tok(
        &remote,
        "r",
        &loop_toml(&thief(tools.path()), "auto"),
        TOKEN,
    );
    let r = clone_with_token(&remote, TOKEN);
    let out = r.lf_env(
        &["run", "--loop", "r", "--json"],
        &[("LOOPFLOW_GIT_TOKEN", TOKEN)],
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json()["outcome"], "tick", "{out:?}");
    let loot = remote.git(&["show", "loopflow/r:loot.txt"]);
    assert!(
        loot.contains("LOOPFLOW_LOOP=r"),
        "the agent ran and its loot landed: {loot}"
    );
    let b64 = header(TOKEN);
    let b64 = b64.rsplit(' ').next().expect("b64");
    assert!(!loot.contains(TOKEN), "the token leaked:\n{loot}");
    assert!(!loot.contains(b64), "the token's header leaked:\n{loot}");
    let auth =
        std::fs::read_to_string(remote.control.as_ref().unwrap().with_extension("json.auth"))
            .expect("auth log");
    assert!(
        auth.contains(b64),
        "loopflow's git authenticated with the token"
    );
    // Without the token loopflow cannot reach the remote: the server refuses it.
    let no = r.lf(&["run", "--loop", "r", "--json"]);
    assert_eq!(no.code, 4, "{no:?}");
}

/// What `actions/checkout` leaves without `persist-credentials: false`: the token as an
/// `http.<url>.extraheader` in `.git/config`, which agents read. Under `enforce` the tick
/// halts before any agent runs, naming the file and line and the fix; under `auto` it
/// warns the same way.
#[test]
fn a_token_in_git_config_is_refused_under_enforce_and_named_under_auto() {
    let remote = Remote::new(Transport::File);
    let tools = tempfile::tempdir().expect("tempdir");
    let agent = thief(tools.path());
    let human = start_plain(&remote, &loop_toml(&agent, "enforce"));
    let r = remote.clone();
    let b64 = header(TOKEN);
    let b64 = b64.rsplit(' ').next().expect("b64").to_string();
    git(
        r.path(),
        &[
            "config",
            "http.https://github.com/.extraheader",
            &format!("AUTHORIZATION: basic {b64}"),
        ],
    );
    let out = r.lf(&["run", "--loop", "r", "--json"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json()["outcome"], "halt", "{out:?}");
    assert_eq!(
        out.json()["reason"],
        "human_intervention:credential_exposed",
        "{out:?}"
    );
    let state = remote.state("r");
    let detail = state["halt"]["detail"]
        .as_str()
        .expect("detail")
        .to_string();
    assert!(
        detail.contains(".git/config:") && detail.contains("persist-credentials: false"),
        "{detail}"
    );
    assert!(!detail.contains(&b64), "never the value: {detail}");
    assert_eq!(
        remote.branch_commits("r"),
        0,
        "no agent ran, nothing committed"
    );
    // Under auto: a WARN naming the line, and the tick runs.
    human.loop_toml("r", &loop_toml(&agent, "auto").render());
    human.commit_all("auto");
    git(human.path(), &["push", "-q", "origin", "main"]);
    git(r.path(), &["pull", "-q", "origin", "main"]);
    let h = human.lf(&["approve", "--loop", "r", "--note", "looked"]);
    assert_eq!(h.code, 0, "{h:?}");
    let out = r.lf(&["run", "--loop", "r", "--json"]);
    assert_eq!(out.json()["outcome"], "tick", "{out:?}");
    let warned = remote
        .events("r")
        .into_iter()
        .any(|e| e.starts_with("WARN msg=\"credential: ") && e.contains(".git/config:"));
    assert!(warned, "{:#?}", remote.events("r"));
}

/// [`start`] without a token (a `file://` remote).
fn start_plain(remote: &Remote, toml: &LoopToml) -> Project {
    crate::support::remote::start_loop(remote, "r", toml)
}
