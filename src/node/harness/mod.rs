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

pub struct Harness;

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
            keep_output_file(&output_path, &ctx.archive_path());
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

/// The agent's `{{output}}` file lives in its worktree's self-ignoring `.loopflow-out/<loop>/`,
/// which the next tick empties; a copy goes to the loop's `outputs/` for the record
/// (`review`, `report`). Only a regular file, at most 16 MiB, never through a link.
fn keep_output_file(from: &std::path::Path, to: &std::path::Path) {
    use std::io::Read;
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    crate::fs_safe::nofollow(&mut o);
    let mut bytes = Vec::new();
    let read = o.open(from).and_then(|f| {
        crate::fs_safe::regular(&f)?;
        f.take(crate::fs_safe::TEXT_MAX).read_to_end(&mut bytes)
    });
    if read.is_err() {
        return;
    }
    // A record copy, written like the prompt, stdout and stderr beside it: no fsyncs, no
    // temp file a kill could leave in `outputs/`.
    let _ = crate::fs_safe::write_owned(to, &bytes);
}
