//! `harness`: runs a role's agent. The role's prompt is rendered as a template into
//! `outputs/<N>-<role>.prompt.md`; the argv comes from `loop.toml`, one template per
//! element, never through a shell.

use std::hash::{BuildHasher, Hasher};

use serde_json::{Value, json};

use crate::diag::Diagnostics;
use crate::exec::NodeCtx;
use crate::node::{NodeKind, NodeRun, NodeSpec, render_argv, show_argv, spawn_node};
use crate::toml_read::{Str, Table};

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
    /// Adds the role variables and renders the prompt. Returns the vars, the prompt path
    /// and the rendered prompt text.
    fn prepare(&self, ctx: &NodeCtx<'_>) -> Result<(Value, std::path::PathBuf, String), String> {
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
        let prompt = match &cfg.prompt {
            Some((path, _)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("prompt {}: {e}", path.display()))?;
                crate::template::render(&ctx.env.hb, &text, &vars)
                    .map_err(|e| format!("prompt {}: {e}", path.display()))?
            }
            None => String::new(),
        };
        // Agents that take the prompt as an argument (presets) get its text.
        if let Value::Object(m) = &mut vars {
            m.insert("prompt_text".into(), json!(prompt));
        }
        Ok((vars, prompt_path, prompt))
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
        let (vars, prompt_path, prompt) = match self.prepare(ctx) {
            Ok(x) => x,
            Err(e) => return fail(format!("template:{e}")),
        };
        if let Err(e) = std::fs::write(&prompt_path, prompt) {
            return fail(format!("io:{}: {e}", prompt_path.display()));
        }
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
                .and_then(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_default();
            let u = crate::preset::extract(&usage, &text);
            o.cost_usd = u.cost_usd;
            o.tokens = u.tokens;
            o.answer = u.text;
        };
        match spawn_node(ctx, &argv, timeout) {
            NodeRun::Ok(mut o) => {
                finish(&mut o);
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
        let (vars, _, _) = self.prepare(ctx)?;
        Ok(Some(show_argv(&self.argv(ctx, vars)?)))
    }
}
