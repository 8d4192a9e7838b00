//! `[sandbox]` (DESIGN §12): how spawned processes are confined. `mode` says what to do
//! when the kernel cannot confine them, `write` widens what they may write, `network`
//! can deny TCP.

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

#[derive(Debug, Clone, Default)]
pub struct SandboxConfig {
    pub mode: SandboxMode,
    /// Extra writable paths (`~/` expanded), as written, with their spans.
    pub write: Vec<(PathBuf, Str)>,
    /// `network = "deny"`: no TCP connect or bind.
    pub deny_network: bool,
}

/// A preset's state directory (`sandbox_write`) where its agent will write: `~/x` under
/// the home directory, and — for one under `~/.config`, `~/.local/share`,
/// `~/.local/state` or `~/.cache` — also under `XDG_CONFIG_HOME`, `XDG_DATA_HOME`,
/// `XDG_STATE_HOME` or `XDG_CACHE_HOME` when that is set to an absolute path: an agent
/// that follows the XDG base directories (OpenCode does) writes there instead. Both stay
/// allowed, since not every agent that uses `~/.config` reads the variable.
pub fn expand_state_dir(p: &str) -> Vec<PathBuf> {
    expand_state_dir_with(p, |k| std::env::var_os(k))
}

/// The XDG base directories and the default each one replaces.
const XDG_DIRS: &[(&str, &str)] = &[
    ("~/.config", "XDG_CONFIG_HOME"),
    ("~/.local/share", "XDG_DATA_HOME"),
    ("~/.local/state", "XDG_STATE_HOME"),
    ("~/.cache", "XDG_CACHE_HOME"),
];

fn expand_state_dir_with(
    p: &str,
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Vec<PathBuf> {
    let mut out = vec![expand_home(p)];
    for (default, key) in XDG_DIRS {
        let Some(rest) = p.strip_prefix(default) else {
            continue;
        };
        if !(rest.is_empty() || rest.starts_with('/')) {
            continue; // `~/.configs` is not under `~/.config`
        }
        // The spec ignores a relative value; so do the agents.
        let Some(base) = var(key).map(PathBuf::from).filter(|b| b.is_absolute()) else {
            continue;
        };
        let rest = rest.trim_start_matches('/');
        let alt = if rest.is_empty() {
            base
        } else {
            base.join(rest)
        };
        if !out.contains(&alt) {
            out.push(alt);
        }
    }
    out
}

/// `~/x` under the home directory; anything else as written.
pub fn expand_home(p: &str) -> PathBuf {
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
    t.deny_unknown(&["mode", "write", "network"], diags);
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
    let write = t
        .str_list("write", diags)
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
                                format!("`sandbox.write` path `{}` is not absolute", s.value),
                            )
                            .label("relative path")
                            .help("write an absolute path or one under `~/`, e.g. \"~/.cache/my-tool\""),
                        );
                        None
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let deny_network = match t.str("network", diags) {
        None => false,
        Some(s) => match s.value.as_str() {
            "allow" => false,
            "deny" => true,
            other => {
                diags.push(
                    Diagnostic::error(
                        Code::InvalidValue,
                        t.source,
                        s.span,
                        format!("`sandbox.network` cannot be `{other}`"),
                    )
                    .label("not a network policy")
                    .help("use \"allow\" (the default) or \"deny\" (no TCP connections)"),
                );
                false
            }
        },
    };
    SandboxConfig {
        mode,
        write,
        deny_network,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `~/.local/share/x` follows XDG_DATA_HOME (and keeps its default); other paths, a
    /// relative value and a look-alike prefix do not.
    #[test]
    fn state_dirs_follow_the_xdg_base_directories() {
        let var = |k: &str| match k {
            "XDG_DATA_HOME" => Some("/xdg/data".into()),
            "XDG_CACHE_HOME" => Some("relative/cache".into()),
            "XDG_CONFIG_HOME" => Some("/xdg/config".into()),
            _ => None,
        };
        let got = |p: &str| expand_state_dir_with(p, var);
        assert_eq!(
            got("~/.local/share/opencode"),
            [
                expand_home("~/.local/share/opencode"),
                PathBuf::from("/xdg/data/opencode")
            ]
        );
        assert_eq!(
            got("~/.config"),
            [expand_home("~/.config"), PathBuf::from("/xdg/config")]
        );
        // A relative XDG_CACHE_HOME is ignored; XDG_STATE_HOME is unset.
        assert_eq!(got("~/.cache/x"), [expand_home("~/.cache/x")]);
        assert_eq!(got("~/.local/state/x"), [expand_home("~/.local/state/x")]);
        assert_eq!(got("~/.configs/x"), [expand_home("~/.configs/x")]);
        assert_eq!(got("~/.claude"), [expand_home("~/.claude")]);
    }
}
