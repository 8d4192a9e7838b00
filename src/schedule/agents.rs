//! What a runner elsewhere (a GitHub Actions job, a Kubernetes pod) needs besides
//! loopflow to run a loop: the agent CLIs its roles run, how each is installed at a
//! pinned version, and the API-key variables each reads (taken from secrets there).

/// How an agent CLI is installed on a fresh runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Install {
    /// `npm install -g <package@version>`.
    Npm(String),
    /// `pipx install <package==version>`.
    Pipx(String),
    /// No package registry carries it; why, and what to do.
    Manual(String),
}

/// An agent loopflow has a preset for.
#[derive(Debug)]
pub(crate) struct Known {
    pub preset: &'static str,
    /// The program its preset runs.
    pub program: String,
    pub install: Install,
    /// The environment variables holding its API keys. Agents that talk to several
    /// providers list the common ones; only the one the configured model needs must be
    /// set.
    pub keys: Vec<String>,
}

/// Every preset, as a runner installs it: read from the presets' own `install` and
/// `secrets` keys (one source, pinned to the versions CI runs against the fake model
/// server), once.
pub(super) fn known() -> &'static [Known] {
    use crate::preset::Registry;
    static KNOWN: std::sync::OnceLock<Vec<Known>> = std::sync::OnceLock::new();
    KNOWN.get_or_init(|| {
        crate::preset::names()
            .into_iter()
            .filter_map(|name| {
                let mut d = crate::diag::Diagnostics::default();
                let p = crate::preset::load(name, &mut d)?;
                let install = match p.registry() {
                    Some(Registry::Npm(pkg)) => Install::Npm(pkg.to_string()),
                    Some(Registry::Pip(pkg)) => Install::Pipx(pkg.to_string()),
                    None => Install::Manual(format!(
                        "{name} is published in no package registry loopflow knows; install it in a step of your own"
                    )),
                };
                Some(Known {
                    preset: name,
                    program: p.program().to_string(),
                    install,
                    keys: p.secrets.clone(),
                })
            })
            .collect()
    })
}

/// An agent a loop's roles run, as the runner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AgentUse {
    /// A known agent (by its preset, or a command running its program).
    Known(&'static str),
    /// A program given by path: in the repository (relative) or on this machine
    /// (absolute), which a fresh runner does not have.
    Path(String),
    /// Another program looked up on PATH: the runner must have it.
    Program(String),
}

impl AgentUse {
    /// Classifies what a role runs: its preset, else the first element of its command.
    pub(crate) fn of(preset: Option<&str>, program: &str) -> AgentUse {
        if let Some(k) = preset.and_then(|p| known().iter().find(|k| k.preset == p)) {
            return AgentUse::Known(k.preset);
        }
        if program.contains('/') {
            return AgentUse::Path(program.to_string());
        }
        match known().iter().find(|k| k.program == program) {
            Some(k) => AgentUse::Known(k.preset),
            None => AgentUse::Program(program.to_string()),
        }
    }

    pub(crate) fn known(&self) -> Option<&'static Known> {
        match self {
            AgentUse::Known(p) => known().iter().find(|k| k.preset == *p),
            _ => None,
        }
    }
}

/// The API-key variables the agents read, plus `extra`, sorted, each once.
pub(super) fn secrets(agents: &[AgentUse], extra: &[String]) -> Vec<String> {
    let mut out: Vec<String> = agents
        .iter()
        .filter_map(AgentUse::known)
        .flat_map(|k| k.keys.iter().cloned())
        .chain(extra.iter().cloned())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_known() {
        for name in crate::preset::names() {
            assert!(known().iter().any(|k| k.preset == name), "{name}");
        }
    }

    #[test]
    fn agents_are_classified_by_preset_then_program() {
        assert_eq!(AgentUse::of(Some("codex"), "x"), AgentUse::Known("codex"));
        assert_eq!(AgentUse::of(None, "claude"), AgentUse::Known("claude-code"));
        assert_eq!(
            AgentUse::of(None, "./agent.sh"),
            AgentUse::Path("./agent.sh".into())
        );
        assert_eq!(
            AgentUse::of(None, "myagent"),
            AgentUse::Program("myagent".into())
        );
        let s = secrets(
            &[AgentUse::Known("claude-code"), AgentUse::Known("codex")],
            &["EXTRA".into()],
        );
        assert_eq!(s, ["ANTHROPIC_API_KEY", "EXTRA", "OPENAI_API_KEY"]);
    }
}
