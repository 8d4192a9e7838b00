//! `doctor`: what a tick will need, checked without spending anything — each role's
//! program on `PATH`, its credential (the preset's key variable or the CLI's own login),
//! the model host through the tick's proxy (a TCP connection, never an API call), the
//! sandbox, git, and where a scheduled tick will take its key from. Exits 1 naming each
//! missing thing and its fix. [`quick`] is the part that costs nothing (no network), for
//! the one-line hints of `create`, `run --dry-run` and `schedule install`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use crate::config::{LoopConfig, Network, SandboxMode};
use crate::exit;
use crate::out::{outln, printable};
use crate::preset::Preset;

#[derive(Args, Debug)]
pub(crate) struct DoctorArgs {
    /// The loop to check; default: every loop of the project.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: Option<String>,
    /// One JSON document on stdout: `{"ok", "checks": [{"loop", "role", "check", "ok",
    /// "detail", "fix"}]}`.
    #[arg(long)]
    pub json: bool,
}

/// One thing checked.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Finding {
    #[serde(rename = "loop")]
    pub loop_name: Option<String>,
    /// The roles it concerns (`implement, verify`), when it is an agent's.
    pub role: Option<String>,
    /// `program`, `credential`, `model_host`, `sandbox`, `git`, `schedule`.
    pub check: &'static str,
    pub ok: bool,
    pub detail: String,
    /// What to do, when not ok.
    pub fix: Option<String>,
}

impl Finding {
    fn ok(check: &'static str, detail: String) -> Finding {
        Finding {
            loop_name: None,
            role: None,
            check,
            ok: true,
            detail,
            fix: None,
        }
    }
    fn fail(check: &'static str, detail: String, fix: String) -> Finding {
        Finding {
            ok: false,
            fix: Some(fix),
            ..Finding::ok(check, detail)
        }
    }
}

/// One agent of a loop: the roles that run it, its program and its preset.
struct AgentUse {
    roles: Vec<String>,
    program: String,
    preset: Option<std::sync::Arc<Preset>>,
}

fn agents_of(cfg: &LoopConfig) -> Vec<AgentUse> {
    let mut out: Vec<AgentUse> = Vec::new();
    for role in cfg.roles.keys() {
        let program = cfg
            .command_for(role)
            .first()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        let preset = cfg.agent(role).def;
        match out.iter_mut().find(|a| {
            a.program == program
                && a.preset.as_ref().map(|p| p.name) == preset.as_ref().map(|p| p.name)
        }) {
            Some(a) => a.roles.push(role.clone()),
            None => out.push(AgentUse {
                roles: vec![role.clone()],
                program,
                preset,
            }),
        }
    }
    out
}

/// `p` with the home directory as `~`.
fn tilde(p: &Path) -> String {
    match std::env::var_os("HOME").map(PathBuf::from) {
        Some(h) if !h.as_os_str().is_empty() && p.starts_with(&h) => {
            format!("~/{}", p.strip_prefix(&h).unwrap_or(p).display())
        }
        _ => p.display().to_string(),
    }
}

/// Where the agent's program is: on `PATH`, or the path the argv names.
fn program(a: &AgentUse, project: &Path) -> Finding {
    let p = &a.program;
    let found = if p.contains('/') {
        let path = if Path::new(p).is_absolute() {
            PathBuf::from(p)
        } else {
            project.join(p)
        };
        path.is_file().then_some(path)
    } else {
        crate::preset::find_on_path(p)
    };
    match found {
        Some(f) => Finding::ok("program", format!("{p} ({})", tilde(&f))),
        None => {
            let fix = match a.preset.as_ref().and_then(|x| x.install_command()) {
                Some(cmd) => format!(
                    "install it: `{cmd}` (the version its preset was checked against), or put `{p}` on PATH"
                ),
                None => format!("put `{p}` on PATH, or name it by its absolute path in loop.toml"),
            };
            Finding::fail("program", format!("{p} is not on PATH"), fix)
        }
    }
}

/// Where a preset's agent will take its credential from, if anywhere: a key variable
/// (the preset's, or one `[sandbox] env` passes), else the CLI's own login file.
pub(crate) fn credential_source(preset: &Preset, cfg: &LoopConfig) -> Option<String> {
    let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty());
    if let Some(v) = preset.secrets.iter().find(|v| set(v)) {
        return Some(format!("{v} (set here)"));
    }
    if let Some(v) = cfg.sandbox.env.iter().find(|v| !v.ends_with('*') && set(v)) {
        return Some(format!("{v} (set here, passed by [sandbox] env)"));
    }
    preset
        .state
        .logins()
        .filter_map(crate::preset::home::source)
        .find(|p| p.is_file())
        .map(|p| format!("the CLI's own login, {}", tilde(&p)))
}

/// The fix for an agent with no credential.
fn credential_fix(preset: &Preset) -> String {
    let keys = preset.secrets.join(" or ");
    let login = preset
        .state
        .logins()
        .filter_map(crate::preset::home::source)
        .next()
        .map(|p| {
            format!(
                ", or log in with `{}` once (it keeps its login in {})",
                preset.program(),
                tilde(&p)
            )
        })
        .unwrap_or_default();
    format!(
        "export {keys}{login}; a scheduled tick needs it too (`loopflow doctor` checks the schedule)"
    )
}

fn credential(a: &AgentUse, cfg: &LoopConfig) -> Option<Finding> {
    let p = a.preset.as_ref()?;
    Some(match credential_source(p, cfg) {
        Some(from) => Finding::ok("credential", from),
        None => Finding::fail(
            "credential",
            format!(
                "no {} is set and {} has no login here",
                p.secrets.join(" or "),
                p.program()
            ),
            credential_fix(p),
        ),
    })
}

/// Where the preset's agent sends its requests: its base-URL variable when set, else
/// its first API host (port 443).
fn model_host(p: &Preset) -> Option<(String, u16)> {
    for v in &p.endpoint {
        let url = match v.strip_prefix('$') {
            Some(var) => match std::env::var(var) {
                Ok(u) if !u.is_empty() => u,
                _ => continue,
            },
            None => v.clone(),
        };
        if let Some(hp) = host_port(&url) {
            return Some(hp);
        }
    }
    p.hosts
        .iter()
        .find(|h| !h.starts_with("*.") && !h.contains("npmjs"))
        .map(|h| (h.clone(), 443))
}

/// `https://host[:port]/…` → (host, port).
fn host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let default = if scheme.eq_ignore_ascii_case("http") {
        80
    } else {
        443
    };
    if let Some(v6) = authority.strip_prefix('[') {
        let (h, tail) = v6.split_once(']')?;
        let port = tail
            .strip_prefix(':')
            .and_then(|p| p.parse().ok())
            .unwrap_or(default);
        return Some((h.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((authority.to_string(), default)),
    }
}

/// A TCP connection to the model host the way a tick's agent would make it: through the
/// tick's proxy under `network = "hosts"` (a `CONNECT`, closed at once), directly under
/// `open`. No request is sent to the host.
fn reach(a: &AgentUse, cfg: &LoopConfig) -> Option<Finding> {
    let p = a.preset.as_ref()?;
    let (host, port) = model_host(p)?;
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let sandboxed = cfg.sandbox.mode != SandboxMode::Off;
    let net = if sandboxed {
        cfg.sandbox.network
    } else {
        Network::Open
    };
    Some(match net {
        Network::Deny => Finding::fail(
            "model_host",
            format!("{target}: `[sandbox] network = \"deny\"` lets the agent reach nothing"),
            "set `[sandbox] network = \"hosts\"` (the default) so it reaches its model API".into(),
        ),
        Network::Open => match connect(&target) {
            Ok(()) => Finding::ok(
                "model_host",
                format!("{target} answers (direct: network = \"open\")"),
            ),
            Err(e) => Finding::fail(
                "model_host",
                format!("{target} does not answer: {e}"),
                "check the address (its base-URL variable), the network and any firewall".into(),
            ),
        },
        Network::Hosts => {
            let hosts: Vec<&str> = cfg
                .sandbox
                .hosts
                .iter()
                .chain(&p.hosts)
                .map(String::as_str)
                .collect();
            let allow = match crate::sandbox::proxy::Allow::parse(&hosts) {
                Ok(a) => a,
                Err(e) => {
                    return Some(Finding::fail(
                        "model_host",
                        format!("the hosts do not parse: {e}"),
                        "fix `[sandbox] hosts` (`loopflow check` says where)".into(),
                    ));
                }
            };
            if !allow.permits(&host, port) {
                return Some(Finding::fail(
                    "model_host",
                    format!(
                        "{target} is not among the hosts the tick's proxy lets the agent reach"
                    ),
                    format!("add \"{target}\" to `[sandbox] hosts` in loop.toml"),
                ));
            }
            match via_proxy(allow, &target) {
                Ok(()) => Finding::ok("model_host", format!("{target} answers through the tick's proxy")),
                Err(e) => Finding::fail(
                    "model_host",
                    format!("{target} does not answer through the tick's proxy: {e}"),
                    "check the address (its base-URL variable), the network and any firewall or corporate proxy".into(),
                ),
            }
        }
    })
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn connect(target: &str) -> Result<(), String> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = target
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .collect();
    let mut last = "no address".to_string();
    for a in addrs {
        match std::net::TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// `CONNECT target` through a proxy of the tick's kind, then hang up.
fn via_proxy(allow: crate::sandbox::proxy::Allow, target: &str) -> Result<(), String> {
    let proxy = crate::sandbox::proxy::Proxy::start().map_err(|e| format!("the proxy: {e}"))?;
    // One client and no supervisor: the connection is unattributed, so it may reach what
    // that client may.
    proxy.client(0, allow);
    let mut s = std::net::TcpStream::connect_timeout(&proxy.addr(), CONNECT_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let _ = s.set_read_timeout(Some(CONNECT_TIMEOUT * 2));
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).map_err(|e| e.to_string())?;
    let head = String::from_utf8_lossy(&buf[..n]);
    let status = head.lines().next().unwrap_or("").trim().to_string();
    if status.split(' ').nth(1) == Some("200") {
        Ok(())
    } else if status.is_empty() {
        Err("the proxy closed the connection".into())
    } else {
        Err(format!("the proxy answered `{status}`"))
    }
}

fn sandbox(cfg: &LoopConfig) -> Finding {
    let summary = crate::sandbox::kernel_summary();
    match cfg.sandbox.mode {
        SandboxMode::Off => Finding::ok(
            "sandbox",
            "off in loop.toml (`[sandbox] mode = \"off\"`): agents run unconfined".into(),
        ),
        mode => {
            let none = summary.starts_with("this kernel has no Landlock");
            if none && mode == SandboxMode::Enforce {
                Finding::fail("sandbox", summary, "run on a kernel with Landlock (Linux 5.13+, ABI 6 for everything), or set `[sandbox] mode = \"auto\"`".into())
            } else {
                Finding::ok("sandbox", summary)
            }
        }
    }
}

fn git(cfg: &LoopConfig, project: &Path) -> Finding {
    let Some((v, numbers)) = crate::git::version() else {
        return Finding::fail(
            "git",
            "git does not run".into(),
            "install git (2.39 or newer)".into(),
        );
    };
    if cfg.worktree && numbers < (2, 39) {
        return Finding::fail(
            "git",
            format!("{v}; a loop's worktree needs git 2.39 or newer"),
            "install git 2.39 or newer (Debian 12's is 2.39.5)".into(),
        );
    }
    if cfg.worktree && crate::git::toplevel(project).is_none() {
        return Finding::fail(
            "git",
            format!(
                "{v}; but the project is not a git repository, and the loop's worktree needs one"
            ),
            "run `git init` and commit, or set `[worktree] enabled = false`".into(),
        );
    }
    Finding::ok("git", v)
}

/// Where a scheduled tick of the loop takes its key from: cron, systemd and launchd
/// never carry the shell's exported variables.
fn schedule(
    paths: &crate::state::LoopPaths,
    cfg: &LoopConfig,
    agents: &[AgentUse],
) -> Vec<Finding> {
    let Some(rec) = crate::schedule::read_record(paths) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in agents {
        let Some(p) = &a.preset else { continue };
        let from_login = p
            .state
            .logins()
            .filter_map(crate::preset::home::source)
            .find(|f| f.is_file());
        if let Some(f) = from_login {
            out.push(Finding::ok(
                "schedule",
                format!(
                    "{} schedule: {} logs in from {}, as you",
                    rec.platform.name(),
                    p.program(),
                    tilde(&f)
                ),
            ));
            continue;
        }
        let keys: Vec<&String> = p
            .secrets
            .iter()
            .chain(cfg.sandbox.env.iter().filter(|v| !v.ends_with('*')))
            .collect();
        let carried = crate::schedule::carried_env(&rec);
        if let Some(k) = keys.iter().find(|k| carried.iter().any(|c| c == **k)) {
            out.push(Finding::ok(
                "schedule",
                format!(
                    "{} schedule: {k} comes from {}",
                    rec.platform.name(),
                    crate::schedule::env_source(rec.platform)
                ),
            ));
            continue;
        }
        out.push(Finding::fail(
            "schedule",
            format!(
                "{} schedule: a scheduled tick will not see {} (the shell's exported variables never reach it) and {} has no login here",
                rec.platform.name(),
                p.secrets.join(" or "),
                p.program()
            ),
            crate::schedule::key_fix(rec.platform, &p.secrets, p.program()),
        ));
    }
    out
}

/// What `doctor` finds for one loop.
fn check_loop(project: &Path, name: &str, net: bool) -> Vec<Finding> {
    let paths = crate::state::LoopPaths::new(project, name);
    let base = std::env::current_dir().unwrap_or_else(|_| project.to_path_buf());
    let cfg = match crate::load::config(&paths, &base) {
        Ok(c) => c,
        Err(_) => {
            return vec![Finding::fail(
                "config",
                "loop.toml does not load".into(),
                format!(
                    "`loopflow check {}` lists every problem",
                    paths.config().display()
                ),
            )];
        }
    };
    let agents = agents_of(&cfg);
    let mut out = Vec::new();
    for a in &agents {
        let role = Some(a.roles.join(", "));
        let mut add = |f: Finding| {
            out.push(Finding {
                role: role.clone(),
                ..f
            })
        };
        add(program(a, project));
        if let Some(f) = credential(a, &cfg) {
            add(f);
        }
        if net && let Some(f) = reach(a, &cfg) {
            add(f);
        }
    }
    if net {
        out.push(sandbox(&cfg));
        out.push(git(&cfg, project));
        out.extend(schedule(&paths, &cfg, &agents));
    }
    for f in &mut out {
        f.loop_name = Some(name.to_string());
    }
    out
}

/// The checks that cost nothing (no network, no process): each agent's program and
/// credential. What `create`, `run --dry-run` and `schedule install` hint at.
pub(crate) fn quick(project: &Path, name: &str) -> Vec<Finding> {
    check_loop(project, name, false)
        .into_iter()
        .filter(|f| !f.ok)
        .collect()
}

/// What `schedule install` says about each preset agent's key on platform `p`.
pub(crate) fn key_lines(p: crate::schedule::Platform, cfg: &LoopConfig) -> Vec<String> {
    if !matches!(
        p,
        crate::schedule::Platform::Systemd
            | crate::schedule::Platform::Cron
            | crate::schedule::Platform::Launchd
    ) {
        return Vec::new();
    }
    let agents: Vec<(String, Vec<String>, bool)> = agents_of(cfg)
        .into_iter()
        .filter_map(|a| {
            let p = a.preset?;
            let logged_in = p
                .state
                .logins()
                .filter_map(crate::preset::home::source)
                .any(|f| f.is_file());
            Some((p.program().to_string(), p.secrets.clone(), logged_in))
        })
        .collect();
    crate::schedule::how_keys_reach(p, &agents)
}

/// The one-line hint for `create`, `run --dry-run` and `schedule install`, when something
/// a tick needs is missing.
pub(crate) fn hint(project: &Path, name: &str) -> Option<String> {
    let missing = quick(project, name);
    if missing.is_empty() {
        return None;
    }
    let what: Vec<String> = missing.iter().map(|f| f.detail.clone()).collect();
    Some(format!(
        "hint: {}; `loopflow doctor --loop {name}` checks what a tick needs and says how to fix it",
        what.join("; ")
    ))
}

pub(crate) fn doctor(project: &Path, a: DoctorArgs) -> i32 {
    let loops = match &a.loop_name {
        Some(n) => {
            if let Err(code) = super::valid_name(project, n) {
                return code;
            }
            if !crate::state::LoopPaths::new(project, n).dir.is_dir() {
                eprintln!("error: {}", super::no_loop(project, n));
                return exit::USAGE;
            }
            vec![n.clone()]
        }
        None => crate::state::list_loops(project),
    };
    let mut findings: Vec<Finding> = Vec::new();
    for n in &loops {
        findings.extend(check_loop(project, n, true));
    }
    let ok = findings.iter().all(|f| f.ok);
    if a.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            ok: bool,
            checks: &'a [Finding],
        }
        outln!(
            "{}",
            crate::out::json(
                &Doc {
                    ok,
                    checks: &findings
                },
                false
            )
        );
    } else {
        if loops.is_empty() {
            outln!(
                "no loops in {} (create one with `loopflow create --loop NAME`)",
                project.display()
            );
        }
        let mut last = None;
        for f in &findings {
            if last != f.loop_name.as_deref() {
                outln!("loop {}", f.loop_name.as_deref().unwrap_or(""));
                last = f.loop_name.as_deref();
            }
            let who = f
                .role
                .as_ref()
                .map(|r| format!("{r}: "))
                .unwrap_or_default();
            outln!(
                "  {} {:<10} {who}{}",
                if f.ok { "ok  " } else { "FAIL" },
                f.check,
                printable(&f.detail)
            );
            if let Some(fix) = &f.fix {
                outln!("       fix: {}", printable(fix));
            }
        }
        if !ok {
            let n = findings.iter().filter(|f| !f.ok).count();
            outln!("{n} problem(s): a tick would fail or wait on each until it is fixed");
        }
    }
    if ok { exit::OK } else { exit::NO }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_host_and_port() {
        assert_eq!(
            host_port("https://api.anthropic.com"),
            Some(("api.anthropic.com".into(), 443))
        );
        assert_eq!(
            host_port("http://127.0.0.1:8080/v1"),
            Some(("127.0.0.1".into(), 8080))
        );
        assert_eq!(host_port("http://[::1]:9/x"), Some(("::1".into(), 9)));
        assert_eq!(
            host_port("https://u:p@h.example/x"),
            Some(("h.example".into(), 443))
        );
        assert_eq!(host_port("not a url"), None);
    }
}
