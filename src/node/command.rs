//! `command`: runs a fixed argv (e.g. `["cargo", "test"]`) whose elements are templates;
//! exposes its exit code and output to downstream nodes.

use crate::diag::Diagnostics;
use crate::node::{Key, KeyType, NodeCtx, NodeKind, NodeRun, NodeSpec, Spawn, show_argv};
use crate::reason::Failure;
use crate::template::Tmpl;
use crate::toml_read::Table;

pub(super) struct Command;

impl NodeKind for Command {
    fn name(&self) -> &'static str {
        "command"
    }
    fn about(&self) -> &'static str {
        "runs a fixed argv and exposes its exit code and output"
    }
    fn keys(&self) -> &'static [Key] {
        &[Key {
            name: "argv",
            ty: KeyType::StringList,
            about: "command: the argv; each element is a template.",
        }]
    }
    fn parse(&self, t: &Table<'_, '_>, d: &mut Diagnostics) -> Option<Box<dyn NodeSpec>> {
        let a = t.argv("argv", d);
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
    fn runs_process(&self) -> bool {
        true
    }
    fn templates(&self) -> Vec<&Tmpl> {
        self.argv.iter().collect()
    }

    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun {
        match ctx.render_argv(&self.argv, ctx.vars()) {
            Ok(a) => ctx.spawn(Spawn {
                argv: &a,
                timeout: ctx.timeout(),
                ..Default::default()
            }),
            Err(e) => NodeRun::fail(Failure::Template(e.to_string())),
        }
    }

    fn dry_run(&self, ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        Ok(Some(show_argv(
            &ctx.render_argv(&self.argv, ctx.vars())
                .map_err(|e| e.to_string())?,
        )))
    }
}
