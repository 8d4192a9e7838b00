//! What a tick's processes may write, read and reach (DESIGN §12). Writes: the loop's
//! working directory (its worktree; with worktrees off, each existing top-level entry of
//! the project but `.git` and `.loopflow`), the tick's private `TMPDIR`, `/dev/null`-like
//! devices, the paths in `[sandbox] write` and the agent's own state directories. Nothing
//! else — not the loop's state, log, lock or config, not the repository's `.git`. Reads:
//! the system, what they may write, the repository's common `.git`, the loop's
//! `outputs/` (prompts), the toolchains' own parts, the preset's and the loop's `read` —
//! nothing else of the home directory, the main checkout or other processes. Network:
//! TCP to the tick's proxy (`hosts`), none (`deny`) or any (`open`). One ruleset, one
//! proxy and one supervisor serve the whole tick.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::config::{LoopConfig, Network, SandboxMode};
use crate::sandbox::net::TickNet;
use crate::sandbox::proxy::Allow;
use crate::sandbox::{Mode, Net, Policy, Prepared, Sandbox, SandboxError, Shortfall};

/// How many prepared sandboxes a tick keeps (one per distinct set of extra paths: an
/// agent's state directories and install prefix).
const KEPT: usize = 4;

/// The sandbox of one tick: the backend, the policy every spawn starts from, and what
/// the kernel gives for it.
pub(crate) struct Confinement {
    backend: Option<Box<dyn Sandbox>>,
    base: Policy,
    /// The project and its `.loopflow`, resolved: no agent state directory may be or hold
    /// the one, or lie inside the other.
    own: Option<(PathBuf, PathBuf)>,
    /// `[sandbox] hosts`: what every spawn may reach through the proxy.
    hosts: Vec<String>,
    /// The tick's proxy and supervisor, started for its first spawn that needs them.
    net: Mutex<Option<Arc<TickNet>>>,
    /// The sandboxes prepared so far (the extra paths each added), reused for a spawn
    /// with the same: the ruleset is built once per tick, not once per spawn.
    kept: Mutex<Vec<Reused>>,
}

struct Reused {
    extra: Vec<PathBuf>,
    read: Vec<PathBuf>,
    net: Net,
    prepared: Prepared,
}

/// Whether the tick may run its agents, and what to say about it.
pub(crate) enum Verdict {
    /// Confined as asked (or `mode = "off"`).
    Ok,
    /// `mode = "auto"`: running with less than asked; the text says what is missing.
    Weaker(String),
    /// `mode = "enforce"` and the kernel cannot: no agent may run.
    Refused(String),
}

impl Confinement {
    /// The tick's confinement. `cwd` is where agents work, `tmp` the tick's `TMPDIR`,
    /// `outputs` the loop's `outputs/` (where their prompts are).
    pub(crate) fn new(
        config: &LoopConfig,
        project: &Path,
        cwd: &Path,
        tmp: &Path,
        outputs: &Path,
    ) -> Confinement {
        let mode = config.sandbox.mode;
        if mode == SandboxMode::Off {
            return Confinement {
                backend: None,
                base: Policy::new(),
                own: None,
                hosts: Vec::new(),
                net: Mutex::default(),
                kept: Mutex::default(),
            };
        }
        let mut base = Policy::new()
            .net(match config.sandbox.network {
                Network::Open => Net::Open,
                Network::Deny => Net::Deny,
                // The tick's proxy: the address is filled in when it starts.
                Network::Hosts => Net::Proxy(([127, 0, 0, 1], 0).into()),
            })
            .mode(if mode == SandboxMode::Enforce {
                Mode::Enforce
            } else {
                Mode::BestEffort
            })
            .write_dir(tmp);
        if config.worktree {
            base = base.write_dir(cwd);
        } else {
            for (p, is_dir) in top_level_entries(project) {
                base = if is_dir {
                    base.write_dir(p)
                } else {
                    base.write_file(p)
                };
            }
        }
        for (p, _) in &config.sandbox.write {
            base = base.write_dir(p.clone());
        }
        base.confine_reads = true;
        base = base.read_dir(cwd).read_dir(outputs);
        if !config.worktree {
            base = base.read_dir(project);
        }
        if let Some(git) = common_git_dir(cwd).or_else(|| common_git_dir(project)) {
            base = base.read_dir(git);
        }
        for (p, _) in &config.sandbox.read {
            base = base.read_dir(p.clone());
        }
        // loopflow itself (`command` nodes and audits run `loopflow drift`, say).
        if let Ok(exe) = std::env::current_exe() {
            base = base.read_dir(exe);
        }
        for p in toolchains(project) {
            base = base.read_dir(p);
        }
        let real = |p: &Path| {
            p.canonicalize()
                .unwrap_or_else(|_| crate::fs_safe::normalize(p))
        };
        Confinement {
            backend: Some(crate::sandbox::platform_default()),
            base,
            own: Some((real(project), real(&project.join(".loopflow")))),
            hosts: config.sandbox.hosts.clone(),
            net: Mutex::default(),
            kept: Mutex::default(),
        }
    }

    /// An agent's state directories (its preset's `sandbox_write`, expanded) split into
    /// those it may write and those it may not: one that is the project or holds it — a
    /// bare `~/.cache` with `XDG_CACHE_HOME=/tmp` and the project under `/tmp` — or lies
    /// inside its `.loopflow` would let the agent rewrite the loop's state and log.
    /// Compared once links and `..` are resolved (each is created first, as the agent
    /// would; a rule needs it to exist).
    fn split_state_dirs(&self, dirs: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let Some((project, own)) = &self.own else {
            return (dirs.to_vec(), Vec::new());
        };
        dirs.iter().cloned().partition(|d| {
            let _ = std::fs::create_dir_all(d);
            let real = d
                .canonicalize()
                .unwrap_or_else(|_| crate::fs_safe::normalize(d));
            !(project.starts_with(&real) || real.starts_with(own))
        })
    }

    /// What the kernel gives for the tick's policy, said once before any agent runs.
    pub(crate) fn verdict(&self) -> Verdict {
        let Some(b) = &self.backend else {
            return Verdict::Ok;
        };
        match b.assess(&self.base) {
            Ok(shortfalls) => {
                let missing: Vec<String> = shortfalls
                    .iter()
                    .filter(|s| s.is_required() || matches!(s, Shortfall::SkippedPath(_)))
                    .map(ToString::to_string)
                    .collect();
                if missing.is_empty() {
                    Verdict::Ok
                } else {
                    Verdict::Weaker(missing.join("; "))
                }
            }
            Err(e) => Verdict::Refused(e.to_string()),
        }
    }

    /// A one-line account for `status`, `--dry-run` and `check --explain`.
    pub(crate) fn describe(&self) -> String {
        let Some(b) = &self.backend else {
            return "sandbox off: spawned processes may write anywhere the user can".into();
        };
        let writes: Vec<String> = self
            .base
            .write_dirs
            .iter()
            .chain(&self.base.write_files)
            .map(|p| p.display().to_string())
            .collect();
        let net = match self.base.net {
            Net::Open => "network open",
            Net::Deny => "no network",
            Net::Proxy(_) => "network only through the tick's proxy to the allowed hosts",
        };
        let enforced = match b.prepare(&self.base) {
            Ok(p) => {
                let e = p.enforced();
                let on: Vec<&str> = [
                    ("writes", e.files),
                    ("reads", e.reads),
                    ("signals", e.signals),
                    ("TCP", e.network_tcp),
                    ("sockets", e.socket_filter),
                    ("other processes", e.process_filter),
                    ("privileges", e.privileges),
                    ("the terminal", e.session),
                ]
                .iter()
                .filter(|(_, on)| *on)
                .map(|(n, _)| *n)
                .collect();
                if on.is_empty() {
                    format!("{} (nothing enforced)", e.backend)
                } else {
                    format!("{} ABI {} confining {}", e.backend, e.abi, on.join(", "))
                }
            }
            Err(e) => format!("unavailable ({e})"),
        };
        format!(
            "sandbox {enforced}: processes write only {} (+ the agent's state dirs), read only the system, the toolchains and what the loop needs; {net}",
            writes.join(", ")
        )
    }

    /// The sandbox of one agent's spawn: the tick's policy plus the agent's state
    /// directories, less those [`Confinement::split_state_dirs`] refuses (returned, for
    /// the tick to say so), plus `read`; under `network = "hosts"` a client of the tick's
    /// proxy that may reach `[sandbox] hosts` and `hosts` (the preset's).
    pub(crate) fn prepare_agent(
        &self,
        state_dirs: &[PathBuf],
        read: &[PathBuf],
        hosts: &[String],
    ) -> (Result<Option<Prepared>, SandboxError>, Vec<PathBuf>) {
        let (granted, refused) = self.split_state_dirs(state_dirs);
        let prepared = match self.tick_net() {
            Ok(Some(net)) => self
                .prepare_with(&granted, read, Some(net.addr()))
                .and_then(|p| {
                    let all: Vec<&str> =
                        self.hosts.iter().chain(hosts).map(String::as_str).collect();
                    let allow = Allow::parse(&all)
                        .map_err(|e| SandboxError::Proxy(std::io::Error::other(e)))?;
                    Ok(p.map(|p| p.with_client(net.client(allow))))
                }),
            Ok(None) => self.prepare_with(&granted, read, None),
            Err(e) => Err(e),
        };
        (prepared, refused)
    }

    /// Whether the kernel confines the reads of the tick's processes (so what is outside
    /// their read rules, the checkout's `.git` among it, is beyond their reach).
    pub(crate) fn reads_confined(&self) -> bool {
        self.backend.is_some()
            && self
                .prepare_with(&[], &[], None)
                .ok()
                .flatten()
                .is_some_and(|p| p.enforced().reads)
    }

    /// The tick's proxy and supervisor (`network = "hosts"`, sandbox on), started on first
    /// use; `None` when spawns need none.
    fn tick_net(&self) -> Result<Option<Arc<TickNet>>, SandboxError> {
        if !self.proxied() {
            return Ok(None);
        }
        let mut net = self.net.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = net.as_ref() {
            return Ok(Some(Arc::clone(n)));
        }
        #[cfg(target_os = "linux")]
        let supervised = crate::sandbox::seccomp::available(true);
        #[cfg(not(target_os = "linux"))]
        let supervised = false;
        let n = TickNet::start(supervised).map_err(SandboxError::Proxy)?;
        *net = Some(Arc::clone(&n));
        Ok(Some(n))
    }

    /// The address of the tick's proxy, once a spawn started it.
    pub(crate) fn proxy_addr(&self) -> Option<std::net::SocketAddr> {
        let net = self.net.lock().unwrap_or_else(|e| e.into_inner());
        net.as_ref().map(|n| n.addr())
    }

    /// Whether the sandbox is on (`mode` is not `"off"`).
    pub(crate) fn confines(&self) -> bool {
        self.backend.is_some()
    }

    /// Whether spawns go through the tick's proxy (`network = "hosts"`, sandbox on).
    pub(crate) fn proxied(&self) -> bool {
        self.backend.is_some() && matches!(self.base.net, Net::Proxy(_))
    }

    /// The sandbox of one spawn (`None` when the sandbox is off): the tick's policy plus
    /// `extra` directories, which exist ([`Confinement::split_state_dirs`] made them: a
    /// rule needs the directory), more readable paths and, under `network = "hosts"`, the
    /// tick's proxy (`None`: no proxy, so no TCP at all). The ruleset of an earlier call
    /// with the same paths and network is reused: within a tick the paths it names are
    /// the files they were (none of them is the agents' to replace).
    pub(crate) fn prepare_with(
        &self,
        extra: &[PathBuf],
        read: &[PathBuf],
        proxy: Option<std::net::SocketAddr>,
    ) -> Result<Option<Prepared>, SandboxError> {
        let Some(b) = &self.backend else {
            return Ok(None);
        };
        let net = match self.base.net {
            Net::Proxy(_) => proxy.map_or(Net::Deny, Net::Proxy),
            other => other,
        };
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = kept
            .iter()
            .find(|r| r.extra == extra && r.read == read && r.net == net)
        {
            return Ok(Some(r.prepared.clone()));
        }
        let mut policy = self.base.clone();
        for d in extra {
            policy = policy.write_dir(d.clone());
        }
        for d in read {
            policy = policy.read_dir(d.clone());
        }
        policy.net = net;
        let prepared = b.prepare(&policy)?;
        if kept.len() >= KEPT {
            kept.remove(0);
        }
        kept.push(Reused {
            extra: extra.to_vec(),
            read: read.to_vec(),
            net,
            prepared: prepared.clone(),
        });
        Ok(Some(prepared))
    }
}

/// With worktrees off, what agents may write: every existing top-level entry of the
/// project but `.git` and `.loopflow` (directories whole, files as files: a new
/// top-level file cannot be created).
fn top_level_entries(project: &Path) -> Vec<(PathBuf, bool)> {
    let Ok(rd) = std::fs::read_dir(project) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, bool)> = rd
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy().to_lowercase();
            n != ".git" && n != ".loopflow"
        })
        .filter_map(|e| {
            let t = e.file_type().ok()?;
            // A symlink is followed by the rule: one pointing outside the project would
            // widen the sandbox, so only real entries count.
            if t.is_symlink() {
                return None;
            }
            Some((e.path(), t.is_dir()))
        })
        .collect();
    out.sort();
    out
}

/// The repository's common git directory, as git in `cwd` finds it, without running git:
/// `cwd/.git` itself, or the directory a linked worktree's `.git` file names, up its
/// `commondir` link.
fn common_git_dir(cwd: &Path) -> Option<PathBuf> {
    let dot = cwd.join(".git");
    if dot.is_dir() {
        return Some(dot);
    }
    let text = std::fs::read_to_string(&dot).ok()?;
    let gitdir = PathBuf::from(text.strip_prefix("gitdir:")?.trim());
    let gitdir = if gitdir.is_absolute() {
        gitdir
    } else {
        cwd.join(gitdir)
    };
    let common = std::fs::read_to_string(gitdir.join("commondir"))
        .map(|c| gitdir.join(c.trim()))
        .unwrap_or(gitdir);
    common.canonicalize().ok()
}

/// The home directory, when set.
fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// Whether granting `p` would grant too much: the root, a relative path, the project or a
/// directory holding it, the home directory or one above it.
fn too_wide(p: &Path, project: &Path, home: Option<&Path>) -> bool {
    p == Path::new("/")
        || !p.is_absolute()
        || project.starts_with(p)
        || home.is_some_and(|h| h.starts_with(p))
}

/// The parts of an installation prefix under the home directory a program runs from
/// (`~/.venv`, `~/.nvm/versions/node/v22`): its libraries and a venv's `pyvenv.cfg`, never
/// the prefix itself (`~/.local` holds `share`, `~/.fly` a token in `config.yml`).
const PREFIX_PARTS: &[&str] = &["bin", "lib", "lib64", "libexec", "include", "pyvenv.cfg"];

/// What of a `bin` directory's prefix to read: outside the home directory the prefix
/// (`/usr/local`, `/opt/x`), under it only [`PREFIX_PARTS`].
fn prefix_of(bin: &Path, home: Option<&Path>) -> Vec<PathBuf> {
    let Some(prefix) = bin.parent() else {
        return Vec::new();
    };
    match home.is_some_and(|h| prefix.starts_with(h)) {
        true => PREFIX_PARTS.iter().map(|p| prefix.join(p)).collect(),
        false => vec![prefix.to_path_buf()],
    }
}

/// The toolchains a tick's processes run, where they exist: every `PATH` directory (and
/// its prefix's parts, [`prefix_of`]), the usual per-user toolchain homes, what their
/// location variables name, and git's own configuration files (`~/.gitconfig`,
/// `~/.config/git/{config,ignore,attributes}`), without which git stops. Never the home
/// directory itself or one above it, never a directory because a `PATH` entry lies below
/// it. Of `~/.cargo` only what cargo runs from (`bin`, `registry`, `git`: its
/// `credentials.toml` holds a registry token, its `config.toml` may).
fn toolchains(project: &Path) -> Vec<PathBuf> {
    let home = home();
    let mut out: Vec<PathBuf> = Vec::new();
    let mut add = |p: PathBuf| {
        if !too_wide(&p, project, home.as_deref()) && p.exists() && !out.contains(&p) {
            out.push(p);
        }
    };
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            if let Some(m) = node_modules(&d) {
                add(m);
            } else if d.file_name().is_some_and(|n| n == "bin") {
                prefix_of(&d, home.as_deref())
                    .into_iter()
                    .for_each(&mut add);
            }
            add(d);
        }
    }
    let cargo = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".cargo")));
    if let Some(c) = cargo {
        for sub in ["bin", "registry", "git"] {
            add(c.join(sub));
        }
    }
    for var in [
        "RUSTUP_HOME",
        "GOPATH",
        "GOROOT",
        "NVM_DIR",
        "PYENV_ROOT",
        "JAVA_HOME",
    ] {
        if let Some(v) = std::env::var_os(var) {
            add(PathBuf::from(v));
        }
    }
    // git refuses to run at all when a config file it finds cannot be read.
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|x| !x.is_empty())
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".config")));
    if let Some(x) = xdg {
        for f in ["config", "ignore", "attributes"] {
            add(x.join("git").join(f));
        }
    }
    if let Some(h) = &home {
        for sub in [
            ".gitconfig",
            ".rustup",
            ".npm",
            ".nvm",
            ".pyenv",
            ".local/bin",
            ".local/lib",
            "go",
            ".bun",
            ".deno",
        ] {
            add(h.join(sub));
        }
    }
    out
}

/// Where a program is installed, for reading: the `node_modules` its real path lies in
/// (an npm package's files sit beside its link in `.bin`), else its prefix's parts
/// ([`prefix_of`]) when it lies in a `bin`, else — outside the home directory — its
/// directory, and under it the file itself (`~/.local/share/claude/versions/2.1.0`, which
/// reads itself). Nothing for a program that is not found.
pub(crate) fn install_prefix(
    program: &str,
    path: Option<&std::ffi::OsStr>,
    project: &Path,
) -> Vec<PathBuf> {
    if program.contains('/') {
        // A program named by its path (a script of the user's): the file itself, which
        // its interpreter reads, and nothing beside it.
        let f = PathBuf::from(program);
        return f.canonicalize().map_or_else(|_| vec![f], |c| vec![c]);
    }
    // Found as the spawn will find it (and remembered for it).
    #[cfg(target_os = "linux")]
    let found = path.and_then(|p| crate::sandbox::launch::resolve(program, &p.to_os_string()));
    #[cfg(not(target_os = "linux"))]
    let found = path.and_then(|p| {
        std::env::split_paths(p)
            .map(|d| d.join(program))
            .find(|f| f.is_file())
    });
    let Some(found) = found else {
        return Vec::new();
    };
    let home = home();
    let mut out = Vec::new();
    for f in [Some(found.clone()), found.canonicalize().ok()]
        .into_iter()
        .flatten()
    {
        let Some(dir) = f.parent() else { continue };
        let under_home = home.as_ref().is_some_and(|h| dir.starts_with(h));
        let grant = match node_modules(dir) {
            Some(m) => vec![m],
            // Its `bin` is among the prefix's parts, so the file is too.
            None if dir.file_name().is_some_and(|n| n == "bin") => prefix_of(dir, home.as_deref()),
            None if under_home => vec![f.clone()],
            None => vec![dir.to_path_buf()],
        };
        for p in grant {
            if !too_wide(&p, project, home.as_deref()) && p.exists() && !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// The outermost `node_modules` directory on `p`'s way down, if any.
fn node_modules(p: &Path) -> Option<PathBuf> {
    let mut acc = PathBuf::new();
    for c in p.components() {
        acc.push(c);
        if c.as_os_str() == "node_modules" {
            return Some(acc);
        }
    }
    None
}
