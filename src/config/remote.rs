//! `[remote]` (DESIGN §16): the loop's state of record lives in its repository, on the
//! remote this names, and every runner and human works through it.

use std::time::Duration;

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::toml_read::Table;

/// The margin a lease lasts beyond the tick's longest possible run, by default.
pub(crate) const DEFAULT_LEASE_MARGIN: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteConfig {
    /// The git remote (`origin`).
    pub name: String,
    /// How long a lease outlives the tick's longest possible run (clock skew, a slow push).
    pub lease_margin: Duration,
}

/// A remote name loopflow puts into ref names and command lines: `origin`, `upstream`,
/// `my-fork.2` — never an option, a path or a URL.
pub(crate) fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.as_bytes()[0].is_ascii_alphanumeric()
        && !n.contains("..")
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

pub(super) fn read(t: Option<Table<'_, '_>>, diags: &mut Diagnostics) -> Option<RemoteConfig> {
    let t = t?;
    t.deny_unknown(&["name", "lease_margin"], diags);
    let name = match t.str("name", diags) {
        Some(s) if !valid_name(&s.value) => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    t.source,
                    s.span.clone(),
                    format!("`remote.name` {:?} is not a git remote name", s.value),
                )
                .label("not a remote name")
                .help(
                    "name a remote of the repository (`git remote -v` lists them), e.g. \"origin\"",
                ),
            );
            "origin".to_string()
        }
        Some(s) => s.value,
        None => "origin".to_string(),
    };
    let lease_margin = t
        .duration("lease_margin", diags)
        .unwrap_or(DEFAULT_LEASE_MARGIN);
    Some(RemoteConfig { name, lease_margin })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_names_are_plain() {
        for ok in ["origin", "up-stream", "fork.2", "A_b"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "-x", "a/b", "a..b", "https://x", "a b", ".x"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
