//! `harness`: runs a role's agent. The role's prompt is rendered as a template into
//! `outputs/<N>-<role>.prompt.md`; the argv comes from `loop.toml`, one template per
//! element, never through a shell.

use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;

use serde_json::Value;

use crate::config::Role;
use crate::diag::Diagnostics;
use crate::node::{
    Key, KeyType, NodeCtx, NodeKind, NodeOutput, NodeRun, NodeSpec, Spawn, show_argv,
};
use crate::reason::Failure;
use crate::state::{Event, LogArg};
use crate::template::vars;
use crate::toml_read::{Str, Table};

mod agent;
mod cache;

pub(super) struct Harness;

impl NodeKind for Harness {
    fn name(&self) -> &'static str {
        "harness"
    }
    fn about(&self) -> &'static str {
        "runs the role's agent command with its rendered prompt"
    }
    fn keys(&self) -> &'static [Key] {
        &[Key {
            name: "role",
            ty: KeyType::String,
            about: "harness: the role whose `[roles.<role>]` in loop.toml gives prompt and command.",
        }]
    }
    fn parse(&self, t: &Table<'_, '_>, d: &mut Diagnostics) -> Option<Box<dyn NodeSpec>> {
        let role = t.str("role", d);
        if role.is_none() && t.get("role").is_none() {
            t.missing("role", "role = \"implement\"", d);
        }
        Some(Box::new(HarnessNode { role: role? }))
    }
}

#[derive(Debug)]
struct HarnessNode {
    role: Str,
}

/// Why a role's prompt or argv could not be prepared (an ABORT `template:…`).
#[derive(Debug, thiserror::Error)]
enum PrepareError {
    #[error("role `{0}` has no [roles.{0}] in loop.toml")]
    NoRole(String),
    #[error("prompt {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("prompt {}: {error}", path.display())]
    Render {
        path: PathBuf,
        error: crate::template::RenderError,
    },
    #[error(transparent)]
    Argv(#[from] crate::node::ArgvError),
}

/// A role's variables and rendered prompt, ready to spawn.
struct Prepared {
    vars: Value,
    prompt_path: PathBuf,
    prompt: String,
    /// Set (with the numbers for the log) when the compaction prompt was rendered instead.
    compacted: Option<String>,
}

/// A fresh id per role per tick (D12: every role runs in a new session).
fn session_id(ctx: &NodeCtx<'_>, role: &str) -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!(
        "{}-{}-{}-{:016x}",
        ctx.scope().loop_name,
        ctx.scope().tick,
        role,
        h.finish()
    )
}

impl HarnessNode {
    fn role_config<'a>(&self, ctx: &NodeCtx<'a>) -> Result<&'a Role, PrepareError> {
        ctx.config()
            .roles
            .get(&self.role.value)
            .ok_or_else(|| PrepareError::NoRole(self.role.value.clone()))
    }

    /// Adds the role variables and renders the prompt (or the compaction prompt).
    fn prepare(&self, ctx: &NodeCtx<'_>) -> Result<Prepared, PrepareError> {
        let role = &self.role.value;
        let cfg = self.role_config(ctx)?;
        let prompt_path = ctx.output_file(role, "prompt.md");
        let mut vars = ctx.vars().clone();
        if let Value::Object(m) = &mut vars {
            vars::role(
                m,
                &vars::Role {
                    role,
                    model: cfg.model.as_deref().unwrap_or(""),
                    session_id: &session_id(ctx, role),
                    prompt: &prompt_path.display().to_string(),
                    prompt_source: &cfg
                        .prompt
                        .as_ref()
                        .map(|p| p.0.display().to_string())
                        .unwrap_or_default(),
                },
            );
        }
        let render = |path: &std::path::Path| -> Result<String, PrepareError> {
            // The text the load checked (and digested); read only a prompt it did not.
            let loaded = ctx.scope().prompts.iter().find(|(p, _)| p == path);
            let read;
            let text = match loaded {
                Some((_, src)) => src.text.as_str(),
                None => {
                    read = crate::fs_safe::read_to_string(path).map_err(|error| {
                        PrepareError::Read {
                            path: path.to_path_buf(),
                            error,
                        }
                    })?;
                    read.as_str()
                }
            };
            ctx.render_with(text, &vars)
                .map_err(|error| PrepareError::Render {
                    path: path.to_path_buf(),
                    error,
                })
        };
        let mut prompt = match &cfg.prompt {
            Some((path, _)) => render(path)?,
            None => String::new(),
        };
        let mut compacted = None;
        if let Some((path, _)) = &cfg.compaction_prompt
            && let Some(c) = self.compaction(ctx, cfg, prompt.len())
        {
            prompt = render(path)?;
            compacted = Some(c);
        }
        // Agents that take the prompt as an argument (presets) get its text.
        if let Value::Object(m) = &mut vars {
            vars::prompt_text(m, &prompt);
        }
        Ok(Prepared {
            vars,
            prompt_path,
            prompt,
            compacted,
        })
    }

    /// Whether the prompt plus the context carried into it would fill more than the
    /// role's `compaction_share` of the context window. Tokens are estimated as bytes/4
    /// (no tokenizer: loopflow never inspects the model). The carried context is the
    /// previous tick's transcript of this node, which an agent continuing the work reads.
    fn compaction(&self, ctx: &NodeCtx<'_>, cfg: &Role, prompt_bytes: usize) -> Option<String> {
        let window = ctx
            .config()
            .brakes
            .context_tokens
            .or_else(|| crate::node::floor_check::detect().map(|d| d.0))?;
        let scope = ctx.scope();
        let carried = scope
            .tick
            .checked_sub(1)
            .filter(|t| *t > 0)
            .and_then(|t| {
                let f = scope.outputs.join(format!("{t}-{}.stdout", ctx.id()));
                std::fs::metadata(f).ok()
            })
            .map_or(0, |m| m.len());
        let bytes = prompt_bytes as u64 + carried;
        let estimate = bytes.div_ceil(4);
        let limit = (window as f64 * cfg.compaction_share).floor() as u64;
        (estimate > limit).then(|| {
            format!(
                "role={} est_tokens={estimate} limit={limit} context_tokens={window} share={} prompt_bytes={prompt_bytes} carried_bytes={carried} estimate=bytes/4",
                self.role.value, cfg.compaction_share
            )
        })
    }

    fn argv(&self, ctx: &NodeCtx<'_>, vars: &Value) -> Result<Vec<String>, PrepareError> {
        Ok(ctx.render_argv(&ctx.config().command_for(&self.role.value), vars)?)
    }
}

impl NodeSpec for HarnessNode {
    fn role(&self) -> Option<&Str> {
        Some(&self.role)
    }
    fn spawns(&self) -> bool {
        true
    }

    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun {
        let Prepared {
            vars,
            prompt_path,
            prompt,
            compacted,
        } = match self.prepare(ctx) {
            Ok(x) => x,
            Err(e) => return NodeRun::fail(Failure::Template(e.to_string())),
        };
        if let Some(c) = &compacted {
            ctx.event(Event::Compact, &[LogArg::Word(c)]);
        }
        if let Err(e) = crate::fs_safe::write_owned(&prompt_path, prompt.as_bytes()) {
            return NodeRun::fail(Failure::Io(format!("{}: {e}", prompt_path.display())));
        }
        let cfg = self.role_config(ctx).ok();
        let cache = match cfg {
            Some(c) if c.cache => match cache::key(ctx, c, &vars) {
                Ok(k) => Some(k),
                Err(e) => {
                    ctx.event(
                        Event::Warn,
                        &[LogArg::Kv(
                            "msg",
                            format!("verdict cache off this tick: {e}"),
                        )],
                    );
                    None
                }
            },
            _ => None,
        };
        let output_path = ctx.output_path();
        // Fresh for this node: whatever an earlier node or process left at its path (a
        // planted verdict, usage, a link) is gone before it runs.
        if let Err(e) = fresh_output(ctx.scope().cwd, &output_path) {
            return NodeRun::fail(Failure::Io(format!("{}: {e}", output_path.display())));
        }
        let argv = match self.argv(ctx, &vars) {
            Ok(a) => a,
            Err(e) => return NodeRun::fail(Failure::Template(e.to_string())),
        };
        let timeout = ctx
            .timeout()
            .or_else(|| cfg.and_then(|c| c.timeout))
            .or(ctx.config().harness_timeout);
        let idle = cfg
            .and_then(|c| c.idle_timeout)
            .or(ctx.config().harness_idle_timeout);
        let agent = ctx.config().agent(&self.role.value);
        let mut env = Vec::with_capacity(agent.set_env.len() + 4);
        for (k, t) in &agent.set_env {
            match ctx.render_with(&t.text, &vars) {
                Ok(v) => env.push((k.clone(), v)),
                Err(e) => {
                    return NodeRun::fail(Failure::Template(format!("env {k}: {e}")));
                }
            }
        }
        // The CLI's own state: the loop's, seeded from the user's login (never the user's
        // directories, which the user's own CLI loads later).
        let own = match agent.def.as_deref().map(|p| agent::prepare(ctx, p)) {
            None => None,
            Some(Ok(o)) => Some(o),
            Some(Err(e)) => return NodeRun::fail(Failure::Io(e.to_string())),
        };
        let mut write = Vec::new();
        if let Some(o) = &own {
            env.extend(o.env.iter().cloned());
            write.extend(o.write.iter().cloned());
        }
        let spawn = Spawn {
            argv: &argv,
            timeout,
            idle,
            stdin: agent.stdin_prompt.then(|| prompt_path.clone()),
            env,
            write,
            read: agent.sandbox_read.clone(),
            pass_env: agent.pass_env.clone(),
            hosts: agent.hosts.clone(),
            own_agent: agent.preset.is_none(),
            work: !matches!(self.role.value.as_str(), "verify" | "orchestrate"),
            ..Default::default()
        };
        let def = agent.def.clone();
        let limit_rule = def.as_ref().and_then(|d| d.limit.clone());
        let watch = limit_rule
            .as_ref()
            .and_then(|r| agent::Watch::new(ctx, r, own.as_ref().and_then(|o| o.root.as_deref())));
        let usage = agent.usage;
        // The agent's own report (preset `usage` rule): answer, cost, tokens, an error it
        // reported while exiting 0, the tool calls it was refused.
        let finish = |o: &mut NodeOutput| -> Option<String> {
            o.output_path = Some(output_path.clone());
            // Captured once the node's processes are gone: what loopflow reads of it later
            // is this copy, which no agent can write.
            let kept = ctx.archive_path();
            o.output_kept = keep_output_file(ctx.scope().cwd, &output_path, &kept).then_some(kept);
            if usage.is_empty() {
                return None;
            }
            let text = o
                .stdout_path
                .as_ref()
                // Bounded like every other read of agent output (16 MiB).
                .and_then(|p| crate::fs_safe::read_to_string(p).ok())
                .unwrap_or_default();
            let u = crate::preset::extract(&usage, &text);
            o.cost_usd = u.cost_usd;
            o.tokens = u.tokens;
            o.answer = u.text;
            if !u.denials.is_empty() {
                ctx.warn(format!(
                    "the agent was refused {} tool call(s): {}",
                    u.denials.len(),
                    u.denials.join("; ")
                ));
            }
            u.error
        };
        if let Some(key) = &cache
            && let Some(mut out) = cache::replay(ctx, &self.role.value, key)
        {
            finish(&mut out);
            return NodeRun::Ok(out);
        }
        let ran = std::thread::scope(|s| {
            if let Some(w) = &watch {
                s.spawn(|| w.run(ctx));
            }
            let ran = ctx.spawn(spawn);
            if let Some(w) = &watch {
                w.stop();
            }
            ran
        });
        // The provider refused the agent for a usage or rate limit: not the agent's
        // failure, not an iteration, and every loop of this preset and credential waits.
        if let (Some(w), Some(d), Some(r)) = (&watch, &def, &limit_rule)
            && let Some(message) = w.found()
        {
            return NodeRun::Skip(agent::limited(ctx, d, r, &message));
        }
        match ran {
            NodeRun::Ok(mut o) => match finish(&mut o) {
                Some(error) => {
                    o.why = agent::why(&o, Some(&error));
                    NodeRun::Failed {
                        reason: Failure::Agent(error),
                        output: o,
                    }
                }
                None => {
                    if let Some(key) = &cache {
                        cache::store(ctx, &self.role.value, key, o.stdout_path.as_deref());
                    }
                    NodeRun::Ok(o)
                }
            },
            NodeRun::Failed { reason, mut output } => {
                let reported = finish(&mut output);
                output.why = agent::why(&output, reported.as_deref());
                NodeRun::Failed { reason, output }
            }
            other => other,
        }
    }

    fn dry_run(&self, ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        let p = self.prepare(ctx).map_err(|e| e.to_string())?;
        let mut argv = show_argv(&self.argv(ctx, &p.vars).map_err(|e| e.to_string())?);
        // A preset's agent reads the prompt on stdin: the argv alone would not say so.
        if ctx.config().agent(&self.role.value).stdin_prompt {
            let path = show_argv(&[p.prompt_path.display().to_string()]);
            argv.push_str(&format!(" < {path}"));
        }
        Ok(Some(match p.compacted {
            Some(c) => format!("{argv}  (compaction prompt: {c})"),
            None => argv,
        }))
    }
}

/// The components of `path` below `cwd` (`.loopflow-out`, the loop, the file), each a
/// single name; `None` for a path that does not lie beneath it.
fn below<'a>(cwd: &std::path::Path, path: &'a std::path::Path) -> Option<Vec<&'a std::ffi::OsStr>> {
    let rel = path.strip_prefix(cwd).ok()?;
    let parts: Vec<&std::ffi::OsStr> = rel
        .components()
        .map(|c| match c {
            std::path::Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect::<Option<_>>()?;
    (!parts.is_empty()).then_some(parts)
}

/// Makes `{{output}}` fresh for a node: every directory between the working directory and
/// it a real directory (one an agent replaced with a link or a file is removed and made
/// again), and nothing at its path.
fn fresh_output(cwd: &std::path::Path, path: &std::path::Path) -> std::io::Result<()> {
    let Some(parts) = below(cwd, path) else {
        return Ok(());
    };
    let mut at = cwd.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let last = i + 1 == parts.len();
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() && !last => continue,
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&at)?,
            Ok(_) => std::fs::remove_file(&at)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if !last {
            std::fs::create_dir(&at)?;
        }
    }
    Ok(())
}

/// Opens `{{output}}` for reading one component at a time, following no link on the way
/// (an agent of a later node could otherwise point `.loopflow-out` at a file of loopflow's
/// own), and only a regular file.
#[cfg(unix)]
fn open_output(cwd: &std::path::Path, path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let bad = || std::io::Error::from(std::io::ErrorKind::InvalidInput);
    let parts = below(cwd, path).ok_or_else(bad)?;
    let open = |dir: Option<&OwnedFd>, name: &[u8], flags: i32| -> std::io::Result<OwnedFd> {
        let c = std::ffi::CString::new(name).map_err(|_| bad())?;
        let base = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
        // SAFETY: openat on a NUL-terminated name and a live directory fd (or the cwd).
        let fd = unsafe { libc::openat(base, c.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd of ours.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let mut dir = open(
        None,
        cwd.as_os_str().as_bytes(),
        libc::O_PATH | libc::O_DIRECTORY,
    )?;
    let (file, dirs) = parts.split_last().ok_or_else(bad)?;
    for d in dirs {
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        dir = open(Some(&dir), d.as_bytes(), flags)?;
    }
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    let f = std::fs::File::from(open(Some(&dir), file.as_bytes(), flags)?);
    crate::fs_safe::regular(&f)?;
    Ok(f)
}

#[cfg(not(unix))]
fn open_output(_cwd: &std::path::Path, path: &std::path::Path) -> std::io::Result<std::fs::File> {
    let f = std::fs::File::open(path)?;
    crate::fs_safe::regular(&f)?;
    Ok(f)
}

/// The agent's `{{output}}` file lives in its worktree's self-ignoring `.loopflow-out/<loop>/`,
/// which the next tick empties; a copy goes to the loop's `outputs/` for the record
/// (`review`, `report`) and for everything loopflow reads of it later (the spend). Only a
/// regular file, at most 16 MiB, never through a link. Whether there was one to keep.
fn keep_output_file(cwd: &std::path::Path, from: &std::path::Path, to: &std::path::Path) -> bool {
    use std::io::Read;
    let mut bytes = Vec::new();
    let read = open_output(cwd, from)
        .and_then(|f| f.take(crate::fs_safe::TEXT_MAX).read_to_end(&mut bytes));
    if read.is_err() {
        return false;
    }
    // A record copy, written like the prompt, stdout and stderr beside it: no fsyncs, no
    // temp file a kill could leave in `outputs/`.
    crate::fs_safe::write_owned(to, &bytes).is_ok()
}
