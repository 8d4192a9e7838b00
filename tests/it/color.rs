//! Colour is decided once, like cargo and ripgrep do: `NO_COLOR` off, `CLICOLOR_FORCE`
//! on, `CLICOLOR=0` off, else on a terminal whose `TERM` is not `dumb`. The terminal cases
//! run loopflow under `script`, which gives it a real pseudo-terminal.

use std::process::Command;

use crate::support::{Project, bin};

const BAD: &str = "[nodes.a]\nkind = \"comit\"\n";

fn check(p: &Project, env: &[(&str, &str)]) -> String {
    let mut c = Command::new(bin());
    c.args(["check", "p.toml"]).current_dir(p.path());
    for k in ["NO_COLOR", "CLICOLOR", "CLICOLOR_FORCE", "TERM"] {
        c.env_remove(k);
    }
    c.envs(env.iter().copied());
    let o = c.output().expect("loopflow");
    assert_eq!(o.status.code(), Some(3));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `loopflow check p.toml` on a pseudo-terminal, with `TERM` set as given.
fn check_on_tty(p: &Project, term: &str) -> Option<String> {
    if Command::new("script").arg("--version").output().is_err() {
        println!("NOTICE: `script` (util-linux) is not installed; skipping the terminal cases");
        return None;
    }
    let cmd = format!("{} check p.toml", bin().display());
    let o = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .current_dir(p.path())
        .env_remove("NO_COLOR")
        .env_remove("CLICOLOR")
        .env_remove("CLICOLOR_FORCE")
        .env("TERM", term)
        .output()
        .expect("script");
    Some(String::from_utf8_lossy(&o.stdout).into_owned())
}

#[test]
fn colour_follows_no_color_clicolor_and_term() {
    let p = Project::new();
    p.write("p.toml", BAD);
    let esc = "\u{1b}[";
    assert!(!check(&p, &[]).contains(esc), "a pipe gets no colour");
    assert!(check(&p, &[("CLICOLOR_FORCE", "1")]).contains(esc));
    assert!(!check(&p, &[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")]).contains(esc));
    if let Some(tty) = check_on_tty(&p, "xterm-256color") {
        assert!(tty.contains(esc), "a terminal gets colour: {tty:?}");
        let dumb = check_on_tty(&p, "dumb").expect("script ran before");
        assert!(!dumb.contains(esc), "TERM=dumb gets none: {dumb:?}");
        assert!(dumb.contains("unknown-node-kind"), "{dumb:?}");
    }
}
