//! `command`: runs a fixed argv (e.g. `["cargo", "test"]`) whose elements are templates;
//! exposes its exit code and output to downstream nodes.

use crate::config::argv;
use crate::diag::Diagnostics;
use crate::exec::NodeCtx;
use crate::node::{NodeKind, NodeRun, NodeSpec, render_argv, show_argv, spawn_node};
use crate::template::Tmpl;
use crate::toml_read::Table;

pub struct Command;

impl NodeKind for Command {
    fn name(&self) -> &'static str {
        "command"
    }
    fn about(&self) -> &'static str {
        "runs a fixed argv and exposes its exit code and output"
    }
    fn keys(&self) -> &'static [&'static str] {
        &["argv"]
    }
    fn parse(&self, t: &Table<'_, '_>, d: &mut Diagnostics) -> Option<Box<dyn NodeSpec>> {
        let a = argv(t, "argv", d);
        if a.is_none() && t.get("argv").is_none() {
            t.missing("argv", "argv = [\"cargo\", \"test\"]", d);
        }
        Some(Box::new(CommandNode { argv: a? }))
    }
}

#[derive(Debug)]
struct CommandNode {
    argv: Vec<Tmpl>,
}

impl NodeSpec for CommandNode {
    fn spawns(&self) -> bool {
        false
    }
    fn templates(&self) -> Vec<&Tmpl> {
        self.argv.iter().collect()
    }

    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun {
        match render_argv(ctx, &self.argv) {
            Ok(a) => spawn_node(ctx, &a, ctx.node.timeout),
            Err(e) => NodeRun::Failed {
                reason: format!("template:{e}"),
                output: Default::default(),
            },
        }
    }

    fn dry_run(&self, ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        Ok(Some(show_argv(&render_argv(ctx, &self.argv)?)))
    }
}
