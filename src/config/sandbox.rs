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
