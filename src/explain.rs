//! `check --explain` and `run --dry-run`: what a loop's roles run, and what its tick's
//! processes may write, read, reach and see (DESIGN §12).

use crate::config::{LoopConfig, Network, SandboxMode};
use crate::environ::Environ;
use crate::pipeline::Pipeline;

/// `p` with the user's home shown as `~`, so output reads the same on every machine.
fn tilde(p: &std::path::Path) -> String {
    match std::env::var_os("HOME").map(std::path::PathBuf::from) {
        Some(h) if !h.as_os_str().is_empty() && p.starts_with(&h) => {
            let rest = p.strip_prefix(&h).unwrap_or(p);
            format!("~/{}", rest.display())
        }
        _ => p.display().to_string(),
    }
}

/// `check --explain`: each role's expanded argv (templates unrendered) and where its
/// usage is read from.
pub(crate) fn explain(cfg: &LoopConfig, pipeline: &Pipeline) -> String {
    let mut out = format!("{}:\n", cfg.source.name);
    let sb = &cfg.sandbox;
    let environ = Environ::new(sb, sb.mode != SandboxMode::Off);
    let mut seen = Vec::new();
    for node in &pipeline.nodes {
        let Some(role) = node.spec.role() else {
            continue;
        };
        if seen.contains(&role.value) {
            continue;
        }
        seen.push(role.value.clone());
        let agent = cfg.agent(&role.value);
        let argv: Vec<String> = cfg
            .command_for(&role.value)
            .iter()
            .map(|t| t.text.clone())
            .collect();
        let from = agent
            .preset
            .map_or(String::new(), |p| format!(" (preset {p})"));
        out.push_str(&format!(
            "  role {}{from}: {}\n",
            role.value,
            crate::node::show_argv(&argv)
        ));
        if agent.stdin_prompt {
            out.push_str("    prompt: on stdin (the rendered prompt text)\n");
        }
        if !agent.set_env.is_empty() {
            let names: Vec<&str> = agent.set_env.iter().map(|(k, _)| k.as_str()).collect();
            out.push_str(&format!("    sets: {}\n", names.join(", ")));
        }
        let (sees, _) = environ.names(&agent.pass_env);
        out.push_str(&format!("    sees: {}\n", sees.join(", ")));
        if !agent.pass_env.is_empty() {
            out.push_str(&format!(
                "    passes if set: {}\n",
                agent.pass_env.join(", ")
            ));
        }
        if sb.network == Network::Hosts && !agent.hosts.is_empty() {
            out.push_str(&format!("    may reach: {}\n", agent.hosts.join(", ")));
        }
        if !agent.sandbox_read.is_empty() {
            let files: Vec<String> = agent.sandbox_read.iter().map(|p| tilde(p)).collect();
            out.push_str(&format!("    may also read: {}\n", files.join(", ")));
        }
        if let Some(def) = agent.def.as_ref().filter(|d| !d.state.dirs.is_empty()) {
            let vars: Vec<&str> = def.state.dirs.iter().map(|(k, _)| k.as_str()).collect();
            out.push_str(&format!(
                "    own state: {} (the loop's own, under {}; seeded from yours, never written back)\n",
                vars.join(", "),
                crate::state::machine::base()
                    .map_or_else(|| "$XDG_STATE_HOME/loopflow".into(), |b| tilde(&b.join("agents")))
            ));
        }
        let u = &agent.usage;
        if !u.is_empty() {
            let mut parts = vec![match u.format {
                Some(crate::preset::OutputFormat::Jsonl) => "stdout as JSON lines".to_string(),
                _ => "stdout as JSON".to_string(),
            }];
            if let Some(t) = &u.text {
                parts.push(format!("answer at {t}"));
            }
            if let Some(c) = &u.cost_usd {
                parts.push(format!("cost_usd = {}", c.join(" + ")));
            }
            if let Some(t) = &u.tokens {
                parts.push(format!("tokens = {}", t.join(" + ")));
            }
            out.push_str(&format!("    usage: {}\n", parts.join("; ")));
        }
    }
    out.push_str(&sandbox(cfg));
    out
}

/// What a tick's processes may write, read, reach and see, for `check --explain` and
/// `run --dry-run` (names of variables only, never values).
pub(crate) fn sandbox(cfg: &LoopConfig) -> String {
    let sb = &cfg.sandbox;
    let environ = Environ::new(sb, sb.mode != SandboxMode::Off);
    let (sees, withheld) = environ.names(&[]);
    let env = format!(
        "    env: {} (and each role's `passes if set`); withheld: {}\n",
        sees.join(", "),
        if withheld.is_empty() {
            "nothing".to_string()
        } else {
            withheld.join(", ")
        }
    );
    if sb.mode == SandboxMode::Off {
        return format!(
            "  sandbox: off (agents may read, write and reach anything your user can)\n{env}"
        );
    }
    let mut write = vec![
        "their working directory".to_string(),
        "a private TMPDIR".to_string(),
    ];
    write.extend(sb.write.iter().map(|(p, _)| tilde(p)));
    write.push("each preset's state dirs".into());
    let mut read = vec![
        format!("the system ({}, /proc but its processes)", crate::sandbox::SYSTEM_READS.join(", ")),
        "what they may write".into(),
        "the repository's .git".into(),
        "the loop's outputs/".into(),
        "the toolchains on PATH and under ~ (~/.cargo/bin, registry and git; ~/.rustup, ~/.npm, ~/.nvm, ~/.pyenv, ~/.local/bin, ~/.local/lib, ~/go)".into(),
        "the program's install prefix".into(),
    ];
    read.extend(sb.read.iter().map(|(p, _)| tilde(p)));
    read.push("each preset's sandbox_read".into());
    let net = match sb.network {
        Network::Open => "open (unconfined)".to_string(),
        Network::Deny => "deny (no network)".to_string(),
        Network::Hosts => format!(
            "hosts: TCP only through the tick's proxy on 127.0.0.1, to {}each role's preset hosts; no UDP, raw or unix sockets",
            if sb.hosts.is_empty() {
                String::new()
            } else {
                format!("{}, ", sb.hosts.join(", "))
            }
        ),
    };
    format!(
        "  sandbox: {} ({})\n    write: {}\n    read: {}; nothing else of ~, the main checkout or other processes\n    network: {net}\n{env}",
        sb.mode.as_str(),
        crate::sandbox::kernel_summary(),
        write.join(", "),
        read.join(", "),
    )
}
