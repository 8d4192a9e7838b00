//! `[sandbox]` (DESIGN §12): how spawned processes are confined. `mode` says what to do
//! when the kernel cannot confine them, `write` and `read` widen what they may write and
//! read, `env` what they see of loopflow's environment, `network` and `hosts` what they
//! may reach.

use std::path::PathBuf;

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::toml_read::{Str, Table};

/// What to do about confinement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// Confine where the kernel can; where it cannot, run unconfined and warn once a tick.
    #[default]
    Auto,
    /// No confinement, no agent: the loop halts `human_intervention:sandbox_unavailable`.
    Enforce,
    /// Run unconfined.
    Off,
}

impl SandboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Auto => "auto",
            SandboxMode::Enforce => "enforce",
            SandboxMode::Off => "off",
        }
    }
}

/// What spawned processes may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Network {
    /// Only the preset's and the loop's `hosts`, through the tick's proxy.
    #[default]
    Hosts,
    /// No network at all.
    Deny,
    /// Unconfined (`"allow"` is its old name).
    Open,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::Hosts => "hosts",
            Network::Deny => "deny",
            Network::Open => "open",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct SandboxConfig {
    pub mode: SandboxMode,
    /// Extra writable paths (`~/` expanded), as written, with their spans.
    pub write: Vec<(PathBuf, Str)>,
    /// Extra readable paths (`~/` expanded), as written, with their spans.
    pub read: Vec<(PathBuf, Str)>,
    /// More environment variables passed to spawned processes.
    pub env: Vec<String>,
    /// `env = ["*"]`: all of loopflow's environment is passed.
    pub env_all: bool,
    pub network: Network,
    /// More reachable hosts (`host`, `*.suffix`, `host:port`), checked.
    pub hosts: Vec<String>,
}

/// `~/x` under the home directory; anything else as written.
pub(crate) fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) if !home.is_empty() => PathBuf::from(home).join(rest),
        _ if p == "~" => std::env::var_os("HOME").map_or_else(|| PathBuf::from(p), PathBuf::from),
        _ => PathBuf::from(p),
    }
}

pub(super) fn read(t: Option<Table<'_, '_>>, diags: &mut Diagnostics) -> SandboxConfig {
    let Some(t) = t else {
        return SandboxConfig::default();
    };
    t.deny_unknown(&["mode", "write", "read", "env", "network", "hosts"], diags);
    let mode = match t.str("mode", diags) {
        None => SandboxMode::Auto,
        Some(s) => match s.value.as_str() {
            "auto" => SandboxMode::Auto,
            "enforce" => SandboxMode::Enforce,
            "off" => SandboxMode::Off,
            other => {
                diags.push(
                    Diagnostic::error(Code::InvalidValue, t.source, s.span, format!("`sandbox.mode` cannot be `{other}`"))
                        .label("not a sandbox mode")
                        .help("use \"auto\" (confine where the kernel can; the default), \"enforce\" (halt rather than run unconfined) or \"off\""),
                );
                SandboxMode::Auto
            }
        },
    };
    let write = paths(&t, "write", diags);
    let read = paths(&t, "read", diags);
    let mut env_all = false;
    let env = t
        .str_list("env", diags)
        .map(|(v, _)| {
            v.into_iter()
                .filter_map(|s| {
                    if s.value == "*" {
                        env_all = true;
                        return None;
                    }
                    if valid_env_name(&s.value) {
                        return Some(s.value);
                    }
                    diags.push(
                        Diagnostic::error(
                            Code::InvalidValue,
                            t.source,
                            s.span.clone(),
                            format!("`sandbox.env` entry `{}` is not a variable name", s.value),
                        )
                        .label("not a name")
                        .help("name a variable (letters, digits, `_`; e.g. \"MY_TOKEN\"), or \"*\" to pass all of loopflow's environment"),
                    );
                    None
                })
                .collect()
        })
        .unwrap_or_default();
    let hosts = t
        .str_list("hosts", diags)
        .map(|(v, _)| {
            v.into_iter()
                .filter_map(|s| match crate::sandbox::proxy::Allow::parse(&[&s.value]) {
                    Ok(_) => Some(s.value),
                    Err(why) => {
                        diags.push(
                            Diagnostic::error(
                                Code::InvalidValue,
                                t.source,
                                s.span.clone(),
                                format!("`sandbox.hosts` entry `{}`: {why}", s.value),
                            )
                            .label("not a host")
                            .help("write a host name (\"crates.io\"), a wildcard (\"*.crates.io\") or a host and port (\"127.0.0.1:8080\"), without a scheme or path"),
                        );
                        None
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let network = match t.str("network", diags) {
        None => Network::Hosts,
        Some(s) => match s.value.as_str() {
            "hosts" => Network::Hosts,
            "deny" => Network::Deny,
            "open" | "allow" => Network::Open,
            other => {
                diags.push(
                    Diagnostic::error(
                        Code::InvalidValue,
                        t.source,
                        s.span,
                        format!("`sandbox.network` cannot be `{other}`"),
                    )
                    .label("not a network policy")
                    .help("use \"hosts\" (only the agent's API and `hosts`; the default), \"deny\" (no network) or \"open\" (unconfined)"),
                );
                Network::Hosts
            }
        },
    };
    SandboxConfig {
        mode,
        write,
        read,
        env,
        env_all,
        network,
        hosts,
    }
}

/// A POSIX-ish environment variable name (what a shell could export), or such a prefix
/// followed by `*` (`OTEL_*`).
pub(crate) fn valid_env_name(s: &str) -> bool {
    let s = s.strip_suffix('*').unwrap_or(s);
    let mut b = s.bytes();
    b.next()
        .is_some_and(|c| c == b'_' || c.is_ascii_alphabetic())
        && b.all(|c| c == b'_' || c.is_ascii_alphanumeric())
}

/// `[sandbox] write` or `read`: absolute paths (or under `~/`).
fn paths(t: &Table<'_, '_>, key: &str, diags: &mut Diagnostics) -> Vec<(PathBuf, Str)> {
    t.str_list(key, diags)
        .map(|(v, _)| {
            v.into_iter()
                .filter_map(|s| {
                    let p = expand_home(&s.value);
                    if p.is_absolute() {
                        Some((p, s))
                    } else {
                        diags.push(
                            Diagnostic::error(
                                Code::InvalidValue,
                                t.source,
                                s.span.clone(),
                                format!("`sandbox.{key}` path `{}` is not absolute", s.value),
                            )
                            .label("relative path")
                            .help("write an absolute path or one under `~/`, e.g. \"~/.cache/my-tool\""),
                        );
                        None
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}
