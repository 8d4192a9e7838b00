//! `harness`: runs a role's agent. The role's prompt is rendered as a template into
//! `outputs/<N>-<role>.prompt.md`; the argv comes from `loop.toml`, one template per
//! element, never through a shell.

use std::hash::{BuildHasher, Hasher};

use serde_json::{Value, json};

use crate::diag::Diagnostics;
use crate::exec::NodeCtx;
use crate::node::{NodeKind, NodeRun, NodeSpec, render_argv, show_argv, spawn_node};
use crate::state::LogArg;
use crate::toml_read::{Str, Table};

mod cache;

pub struct Harness;

impl NodeKind for Harness {
    fn name(&self) -> &'static str {
        "harness"
    }
    fn about(&self) -> &'static str {
        "runs the role's agent command with its rendered prompt"
    }
    fn keys(&self) -> &'static [&'static str] {
        &["role"]
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

/// A role's variables and rendered prompt, ready to spawn.
struct Prepared {
    vars: Value,
    prompt_path: std::path::PathBuf,
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
        ctx.env.paths.name,
        ctx.env.tick,
        role,
        h.finish()
    )
}

impl HarnessNode {
    /// Adds the role variables and renders the prompt (or the compaction prompt).
    fn prepare(&self, ctx: &NodeCtx<'_>) -> Result<Prepared, String> {
        let role = &self.role.value;
        let cfg = ctx
            .env
            .config
            .roles
            .get(role)
            .ok_or_else(|| format!("role `{role}` has no [roles.{role}] in loop.toml"))?;
        let prompt_path = ctx.output_file(role, "prompt.md");
        let mut vars = ctx.vars.clone();
        if let Value::Object(m) = &mut vars {
            m.insert("role".into(), json!(role));
            m.insert("model".into(), json!(cfg.model.clone().unwrap_or_default()));
            m.insert("session_id".into(), json!(session_id(ctx, role)));
            m.insert("prompt".into(), json!(prompt_path.display().to_string()));
            m.insert(
                "prompt_source".into(),
                json!(
                    cfg.prompt
                        .as_ref()
                        .map(|p| p.0.display().to_string())
                        .unwrap_or_default()
                ),
            );
        }
        let render = |path: &std::path::Path| -> Result<String, String> {
            let text = crate::fs_safe::read_to_string(path)
                .map_err(|e| format!("prompt {}: {e}", path.display()))?;
            crate::template::render(&ctx.env.hb, &text, &vars)
                .map_err(|e| format!("prompt {}: {e}", path.display()))
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
            m.insert("prompt_text".into(), json!(prompt));
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
    fn compaction(
        &self,
        ctx: &NodeCtx<'_>,
        cfg: &crate::config::Role,
        prompt_bytes: usize,
    ) -> Option<String> {
        let window = ctx
            .env
            .config
            .brakes
            .context_tokens
            .or_else(|| crate::node::floor_check::detect().map(|d| d.0))?;
        let carried = ctx
            .env
            .tick
            .checked_sub(1)
            .filter(|t| *t > 0)
            .and_then(|t| {
                let f = ctx
                    .env
                    .paths
                    .outputs
                    .join(format!("{t}-{}.stdout", ctx.node.id.value));
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

    fn argv(&self, ctx: &NodeCtx<'_>, vars: Value) -> Result<Vec<String>, String> {
        let inner = NodeCtx {
            env: ctx.env,
            index: ctx.index,
            node: ctx.node,
            vars,
            upstream: Vec::new(),
        };
        render_argv(&inner, &ctx.env.config.command_for(&self.role.value))
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
        let fail = |reason: String| NodeRun::Failed {
            reason,
            output: Default::default(),
        };
        let Prepared {
            vars,
            prompt_path,
            prompt,
            compacted,
        } = match self.prepare(ctx) {
            Ok(x) => x,
            Err(e) => return fail(format!("template:{e}")),
        };
        if let Some(c) = &compacted {
            let _ = ctx.env.paths.log("COMPACT", &[LogArg::Word(c)]);
        }
        if let Err(e) = crate::fs_safe::write_owned(&prompt_path, prompt.as_bytes()) {
            return fail(format!("io:{}: {e}", prompt_path.display()));
        }
        let cache = match ctx.env.config.roles.get(&self.role.value) {
            Some(c) if c.cache => match cache::key(ctx, c, &vars) {
                Ok(k) => Some(k),
                Err(e) => {
                    let _ = ctx.env.paths.log(
                        "WARN",
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
        let output_path = vars
            .get("output")
            .and_then(Value::as_str)
            .map(std::path::PathBuf::from);
        let argv = match self.argv(ctx, vars) {
            Ok(a) => a,
            Err(e) => return fail(format!("template:{e}")),
        };
        let cfg = ctx.env.config.roles.get(&self.role.value);
        let timeout = ctx
            .node
            .timeout
            .or_else(|| cfg.and_then(|c| c.timeout))
            .or(ctx.env.config.harness_timeout);
        let usage = ctx.env.config.agent(&self.role.value).usage;
        // The agent's own report (preset `usage` rule): answer, cost and tokens.
        let finish = |o: &mut crate::node::NodeOutput| {
            o.output_path = output_path.clone();
            if usage.is_empty() {
                return;
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
        };
        if let Some(key) = &cache
            && let Some(mut out) = cache::replay(ctx, &self.role.value, key)
        {
            finish(&mut out);
            return NodeRun::Ok(out);
        }
        match spawn_node(ctx, &argv, timeout) {
            NodeRun::Ok(mut o) => {
                finish(&mut o);
                if let Some(key) = &cache {
                    cache::store(ctx, &self.role.value, key, o.stdout_path.as_deref());
                }
                NodeRun::Ok(o)
            }
            NodeRun::Failed { reason, mut output } => {
                finish(&mut output);
                NodeRun::Failed { reason, output }
            }
            other => other,
        }
    }

    fn dry_run(&self, ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        let p = self.prepare(ctx)?;
        let argv = show_argv(&self.argv(ctx, p.vars)?);
        Ok(Some(match p.compacted {
            Some(c) => format!("{argv}  (compaction prompt: {c})"),
            None => argv,
        }))
    }
}
