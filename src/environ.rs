//! What a tick's processes see of loopflow's environment (DESIGN §12): an allowlist, in
//! every sandbox mode and on every platform. A prompt-injected agent that runs `env`
//! finds no `GITHUB_TOKEN`, `AWS_SECRET_ACCESS_KEY` or `SSH_AUTH_SOCK`: only the base set,
//! `LOOPFLOW_*`, its preset's `env` (its API key and endpoint) and `[sandbox] env`.

use std::ffi::OsString;

use crate::config::{Network, SandboxConfig};

/// Passed to every process: what programs need to run as the user (a trailing `*` is a
/// prefix). Beyond DESIGN §12's list: the XDG base directories and the toolchains' own
/// locations (`CARGO_HOME`, …) and the TLS trust stores (`SSL_CERT_FILE`, …), which name
/// files and directories, never credentials — without them an agent that honours them
/// (OpenCode, cargo, a CLI behind a corporate CA) would look in the wrong place.
pub(crate) const BASE: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "TZ",
    "LOOPFLOW_*",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_DIRS",
    "XDG_DATA_DIRS",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "GOPATH",
    "GOROOT",
    "NVM_DIR",
    "PYENV_ROOT",
    "JAVA_HOME",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    // W3C trace context (DESIGN §14): a tick that traces sets both per node; otherwise a
    // context loopflow was started in (a traced CI job) reaches the agents as it is.
    "TRACEPARENT",
    "TRACESTATE",
];

/// The OpenTelemetry variables an agent that exports its own telemetry needs (its
/// endpoint, protocol, service name, resource): passed, but never the `*_HEADERS` ones,
/// which carry the backend's API key (`[sandbox] env` passes them on purpose).
pub(crate) const OTEL: &str = "OTEL_*";

fn otel(name: &str) -> bool {
    matches(OTEL, name) && !name.ends_with("_HEADERS")
}

/// The proxy variables: set to the tick's proxy under `network = "hosts"` (loopflow's own
/// values never pass then), passed as they are otherwise.
pub(crate) const PROXY: &[&str] = &[
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// Whether `name` matches `pattern` (`NAME`, or `PREFIX*`).
pub(crate) fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// The environment filter of one tick.
#[derive(Debug, Clone)]
pub(crate) struct Environ {
    /// `[sandbox] env`.
    loop_env: Vec<String>,
    /// `[sandbox] env = ["*"]`.
    all: bool,
    /// Under `network = "hosts"` the proxy variables are the tick's own.
    own_proxy: bool,
    /// loopflow's environment split once (a tick spawns several processes): what every
    /// process sees, and the rest (which a preset's `env` may pass).
    split: std::sync::OnceLock<Split>,
}

type Vars = Vec<(OsString, OsString)>;

#[derive(Debug, Clone, Default)]
struct Split {
    passed: Vars,
    rest: Vars,
}

impl Environ {
    pub(crate) fn new(sb: &SandboxConfig, proxied: bool) -> Environ {
        Environ {
            loop_env: sb.env.clone(),
            all: sb.env_all,
            own_proxy: proxied && sb.network == Network::Hosts,
            split: std::sync::OnceLock::new(),
        }
    }

    /// Whether a process that may also see `extra` (its preset's `env`) sees `name`.
    pub(crate) fn passes(&self, name: &str, extra: &[String]) -> bool {
        // loopflow's own git credential (DESIGN §16) reaches no spawned process, whatever
        // `[sandbox] env` says: only loopflow's own git processes get it.
        if name == crate::git::remote::TOKEN_VAR || name == crate::git::remote::TOKEN_FILE_VAR {
            return false;
        }
        let proxy = PROXY.contains(&name);
        if proxy && self.own_proxy {
            return false;
        }
        self.all
            || proxy
            || BASE.iter().any(|p| matches(p, name))
            || otel(name)
            || self.loop_env.iter().any(|p| matches(p, name))
            || extra.iter().any(|p| matches(p, name))
    }

    /// What of loopflow's environment a process with `extra` inherits.
    pub(crate) fn pick(&self, extra: &[String]) -> Vec<(OsString, OsString)> {
        let split = self.split.get_or_init(|| {
            let (passed, rest) = std::env::vars_os()
                .filter(|(k, _)| k.to_str().is_some())
                .partition(|(k, _)| k.to_str().is_some_and(|k| self.passes(k, &[])));
            Split { passed, rest }
        });
        let mut out = split.passed.clone();
        out.extend(
            split
                .rest
                .iter()
                .filter(|(k, _)| k.to_str().is_some_and(|k| self.passes(k, extra)))
                .cloned(),
        );
        out
    }

    /// The names a process with `extra` sees from loopflow's environment, sorted, and
    /// those it does not (for `--dry-run` and `check --explain`; values never).
    pub(crate) fn names(&self, extra: &[String]) -> (Vec<String>, Vec<String>) {
        let mut seen = Vec::new();
        let mut withheld = Vec::new();
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if self.passes(&k, extra) {
                seen.push(k);
            } else {
                withheld.push(k);
            }
        }
        seen.sort();
        withheld.sort();
        (seen, withheld)
    }

    /// The variables that some shipped preset reads for its key or endpoint
    /// ([`AGENT_VARS`]), set in loopflow's environment, and withheld from a process with
    /// `extra`: what an agent run by a `command` of the user's own most likely misses.
    pub(crate) fn withheld_agent_vars(&self, extra: &[String]) -> Vec<String> {
        AGENT_VARS
            .iter()
            .filter(|k| std::env::var_os(k).is_some() && !self.passes(k, extra))
            .map(|k| (*k).to_string())
            .collect()
    }
}

/// Every variable a shipped preset passes (its `env`, wildcards left out), sorted: a list,
/// not the presets parsed, because a tick asks at every spawn of a `command` agent and
/// parsing the six presets was a third of a tick's instructions. A unit test keeps it
/// equal to the presets.
pub(crate) const AGENT_VARS: &[&str] = &[
    "AIDER_MODEL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_CUSTOM_HEADERS",
    "ANTHROPIC_HOST",
    "ANTHROPIC_MODEL",
    "CLAUDE_CODE_ENABLE_TELEMETRY",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CODEX_API_KEY",
    "DEEPSEEK_API_KEY",
    "GEMINI_API_KEY",
    "GEMINI_MODEL",
    "GOOGLE_API_KEY",
    "GOOGLE_CLOUD_LOCATION",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_GEMINI_BASE_URL",
    "GOOGLE_GENAI_USE_VERTEXAI",
    "GOOGLE_GENERATIVE_AI_API_KEY",
    "GOOSE_MODEL",
    "GOOSE_PROVIDER",
    "GROQ_API_KEY",
    "OPENAI_API_BASE",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_HOST",
    "OPENCODE_CONFIG",
    "OPENROUTER_API_KEY",
];

/// The proxy variables for a proxy at `addr`. No `NO_PROXY`: loopback goes through it
/// like any host (a server of the user's on 127.0.0.1 is no less a way out).
pub(crate) fn proxy_vars(addr: std::net::SocketAddr) -> Vec<(String, String)> {
    let url = format!("http://{addr}");
    PROXY
        .iter()
        .filter(|k| !k.eq_ignore_ascii_case("no_proxy"))
        .map(|k| ((*k).to_string(), url.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`AGENT_VARS`] is what the shipped presets pass: add a preset's new variable there.
    #[test]
    fn agent_vars_are_the_presets() {
        let mut known: Vec<String> = crate::preset::names()
            .iter()
            .filter_map(|n| crate::preset::load_shared(n, &mut Default::default()))
            .flat_map(|p| p.env.clone())
            .filter(|v| !v.ends_with('*'))
            .collect();
        known.sort();
        known.dedup();
        assert_eq!(
            AGENT_VARS, known,
            "update environ::AGENT_VARS to the presets' env"
        );
    }

    #[test]
    fn allowlist() {
        let sb = SandboxConfig {
            env: vec!["MY_TOKEN".into(), "ACME_*".into()],
            ..SandboxConfig::default()
        };
        let e = Environ::new(&sb, true);
        let preset = vec!["ANTHROPIC_API_KEY".to_string()];
        for ok in [
            "PATH",
            "LC_ALL",
            "LOOPFLOW_LOOP",
            "MY_TOKEN",
            "ACME_1",
            "ANTHROPIC_API_KEY",
        ] {
            assert!(e.passes(ok, &preset), "{ok}");
        }
        for no in [
            "GITHUB_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "SSH_AUTH_SOCK",
            "HTTPS_PROXY",
            "MY_TOKEN2",
        ] {
            assert!(!e.passes(no, &preset), "{no}");
        }
        // Open network: the user's own proxy settings pass.
        let open = SandboxConfig {
            network: Network::Open,
            ..SandboxConfig::default()
        };
        assert!(Environ::new(&open, true).passes("https_proxy", &[]));
        let all = SandboxConfig {
            env_all: true,
            ..SandboxConfig::default()
        };
        assert!(Environ::new(&all, true).passes("GITHUB_TOKEN", &[]));
        // loopflow's own git credential passes nowhere, `env = ["*"]` and presets included.
        for token in ["LOOPFLOW_GIT_TOKEN", "LOOPFLOW_GIT_TOKEN_FILE"] {
            assert!(!Environ::new(&all, true).passes(token, &[token.to_string()]));
            assert!(!e.passes(token, &preset), "{token}");
        }
    }
}
