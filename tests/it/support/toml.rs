//! Builders for the TOML files tests write: a loop's `loop.toml` ([`LoopToml`]) and a
//! pipeline ([`PipelineToml`]), so a test states what differs from the usual loop instead
//! of spelling the whole file out.
//!
//! Each table is a list of `key = value` lines. Setting a key again replaces its line where
//! it stands, so `LoopToml::new().brakes("max_iterations = 3")` is the default loop with a
//! lower cap. Values are TOML source text; [`string`] and [`array`] quote Rust strings.

use std::path::Path;

/// A TOML basic string holding `s`, escaped as TOML requires.
pub fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A TOML array of strings: `["a", "b"]`.
pub fn array<S: AsRef<str>>(items: &[S]) -> String {
    let items: Vec<String> = items.iter().map(|s| string(s.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

/// `[agent, args…]` as a TOML array, the agent given as a path.
fn argv(agent: &Path, args: &[&str]) -> String {
    let mut all = vec![agent.display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    array(&all)
}

/// One table: its name (empty for the top level) and its `key = value` lines.
#[derive(Clone, Debug)]
struct Table {
    name: String,
    lines: Vec<String>,
}

impl Table {
    fn new(name: &str) -> Table {
        Table {
            name: name.to_string(),
            lines: Vec::new(),
        }
    }

    /// Sets each `key = value` line of `lines`: a key the table has is replaced in place,
    /// a new one appended.
    fn set(&mut self, lines: &str) {
        for line in lines.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let key = key_of(line);
            match self.lines.iter_mut().find(|l| key_of(l) == key) {
                Some(l) => *l = line.to_string(),
                None => self.lines.push(line.to_string()),
            }
        }
    }

    fn render(&self, out: &mut String) {
        if !self.name.is_empty() {
            out.push_str(&format!("[{}]\n", self.name));
        }
        for l in &self.lines {
            out.push_str(l);
            out.push('\n');
        }
    }
}

fn key_of(line: &str) -> &str {
    line.split_once('=').map_or(line, |(k, _)| k).trim()
}

/// A `loop.toml`. [`LoopToml::new`] is the loop most tests want:
///
/// ```toml
/// [brakes]
/// max_iterations = 10
/// context_tokens = 32000
///
/// [harness]
///
/// [roles.implement]
/// prompt = "prompts/loop-implement.md"
/// [roles.verify]
/// prompt = "prompts/loop-verifier.md"
/// [roles.orchestrate]
/// prompt = "prompts/loop-orchestrate.md"
///
/// [worktree]
/// enabled = false
/// ```
///
/// and the harness command comes from [`LoopToml::harness_agent`] or
/// [`LoopToml::harness_command`].
#[derive(Clone, Debug)]
pub struct LoopToml {
    top: Table,
    tables: Vec<Table>,
}

impl Default for LoopToml {
    fn default() -> Self {
        Self::new()
    }
}

impl LoopToml {
    pub fn new() -> LoopToml {
        LoopToml {
            top: Table::new(""),
            tables: Vec::new(),
        }
        .table("brakes", "max_iterations = 10\ncontext_tokens = 32000")
        .table("harness", "")
        .role_prompt("implement", "prompts/loop-implement.md")
        .role_prompt("verify", "prompts/loop-verifier.md")
        .role_prompt("orchestrate", "prompts/loop-orchestrate.md")
        .worktree(false)
        .table("sandbox", "mode = \"off\"")
    }

    fn table_mut(&mut self, name: &str) -> &mut Table {
        let i = match self.tables.iter().position(|t| t.name == name) {
            Some(i) => i,
            None => {
                // A new role goes after the other roles; anything else at the end.
                let at = if name.starts_with("roles.") {
                    self.tables
                        .iter()
                        .rposition(|t| t.name.starts_with("roles."))
                        .map_or(self.tables.len(), |i| i + 1)
                } else {
                    self.tables.len()
                };
                self.tables.insert(at, Table::new(name));
                at
            }
        };
        &mut self.tables[i]
    }

    /// Sets `key = value` lines in table `[name]` (created when absent): `work_source`,
    /// `schedule`, `blast_radius`, …
    #[must_use]
    pub fn table(mut self, name: &str, lines: &str) -> Self {
        self.table_mut(name).set(lines);
        self
    }

    /// Removes table `[name]`, so loopflow's default applies (e.g. `worktree`: enabled).
    #[must_use]
    pub fn without(mut self, name: &str) -> Self {
        self.tables.retain(|t| t.name != name);
        self
    }

    /// Sets keys in `[brakes]`: `brakes("max_iterations = 3\ngoal_score = 0.9")`.
    #[must_use]
    pub fn brakes(self, lines: &str) -> Self {
        self.table("brakes", lines)
    }

    /// Replaces the whole `[brakes]` body with `lines`.
    #[must_use]
    pub fn brakes_only(mut self, lines: &str) -> Self {
        self.table_mut("brakes").lines.clear();
        self.table("brakes", lines)
    }

    /// Sets keys in `[harness]`: `harness("timeout = \"1s\"")`.
    #[must_use]
    pub fn harness(self, lines: &str) -> Self {
        self.table("harness", lines)
    }

    /// The harness runs `agent {{role}} {{prompt}}`.
    #[must_use]
    pub fn harness_agent(self, agent: &Path) -> Self {
        self.harness_command(agent, &["{{role}}", "{{prompt}}"])
    }

    /// The harness runs `agent ARGS…` (templates such as `{{role}}` written as they are).
    #[must_use]
    pub fn harness_command(self, agent: &Path, args: &[&str]) -> Self {
        let line = format!("command = {}", argv(agent, args));
        self.harness(&line)
    }

    /// Sets keys in `[roles.<role>]` (created when absent): `role("verify", "cache = true")`.
    #[must_use]
    pub fn role(self, role: &str, lines: &str) -> Self {
        self.table(&format!("roles.{role}"), lines)
    }

    /// The role's `prompt` file.
    #[must_use]
    pub fn role_prompt(self, role: &str, prompt: &str) -> Self {
        let line = format!("prompt = {}", string(prompt));
        self.role(role, &line)
    }

    /// The role's own `command`: `agent ARGS…`.
    #[must_use]
    pub fn role_command(self, role: &str, agent: &Path, args: &[&str]) -> Self {
        let line = format!("command = {}", argv(agent, args));
        self.role(role, &line)
    }

    /// Keeps only these `[roles.*]` tables.
    #[must_use]
    pub fn roles_only(mut self, roles: &[&str]) -> Self {
        self.tables.retain(|t| {
            t.name
                .strip_prefix("roles.")
                .is_none_or(|r| roles.contains(&r))
        });
        self
    }

    /// `[worktree] enabled = …`.
    #[must_use]
    pub fn worktree(self, enabled: bool) -> Self {
        let line = format!("enabled = {enabled}");
        self.table("worktree", &line)
    }

    /// The top-level `pipeline = "…"`.
    #[must_use]
    pub fn pipeline(mut self, path: &Path) -> Self {
        let line = format!("pipeline = {}", string(&path.display().to_string()));
        self.top.set(&line);
        self
    }

    /// `[blast_radius]` with these `allow` and `deny` globs.
    #[must_use]
    pub fn blast_radius(self, allow: &[&str], deny: &[&str]) -> Self {
        let lines = format!("allow = {}\ndeny = {}", array(allow), array(deny));
        self.table("blast_radius", &lines)
    }

    /// Whether the loop runs in a git worktree of its own (loopflow's default when
    /// `[worktree]` is absent).
    pub fn worktree_enabled(&self) -> bool {
        self.tables
            .iter()
            .find(|t| t.name == "worktree")
            .is_none_or(|t| !t.lines.iter().any(|l| l == "enabled = false"))
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        self.top.render(&mut out);
        for t in &self.tables {
            if !out.is_empty() {
                out.push('\n');
            }
            t.render(&mut out);
        }
        out
    }
}

/// A pipeline file: an optional `name` and `[nodes.<id>]` tables in the order given (the
/// order a sequential run follows where `needs` leaves it open).
///
/// ```ignore
/// PipelineToml::named("p")
///     .node("gate", "gate", &[])
///     .command("tests", &["./tests.sh"], &["gate"])
///     .with("on_failure = \"continue\"")
///     .commit("commit", &["tests"])
/// ```
#[derive(Clone, Debug, Default)]
pub struct PipelineToml {
    top: Option<Table>,
    nodes: Vec<Table>,
}

impl PipelineToml {
    /// A pipeline without a `name`.
    pub fn new() -> PipelineToml {
        PipelineToml::default()
    }

    /// The default tick with a `git-commit` node `git` after the commit, its message
    /// naming the loop and iteration.
    pub fn tick_with_git() -> PipelineToml {
        PipelineToml::named("tick-and-git")
            .node("gate", "gate", &[])
            .node("floor-check", "floor-check", &["gate"])
            .harness("implement", "implement", &["floor-check"])
            .harness("verify", "verify", &["implement"])
            .verdict("parse", "verify", &["verify"])
            .commit("commit", &["parse"])
            .git_commit("git", &["commit"])
            .with("message = \"loopflow {{loop}}: iteration {{iteration}}\"")
    }

    /// A pipeline with `name = "…"`.
    pub fn named(name: &str) -> PipelineToml {
        let mut top = Table::new("");
        top.set(&format!("name = {}", string(name)));
        PipelineToml {
            top: Some(top),
            nodes: Vec::new(),
        }
    }

    /// `[nodes.<id>]` with `kind`, the given `key = value` lines, and `needs` (left out
    /// when empty).
    fn push(mut self, id: &str, kind: &str, lines: &str, needs: &[&str]) -> Self {
        let mut t = Table::new(&format!("nodes.{id}"));
        t.set(&format!("kind = {}", string(kind)));
        t.set(lines);
        if !needs.is_empty() {
            t.set(&format!("needs = {}", array(needs)));
        }
        self.nodes.push(t);
        self
    }

    /// A node of any kind with nothing but `kind` and `needs`.
    #[must_use]
    pub fn node(self, id: &str, kind: &str, needs: &[&str]) -> Self {
        self.push(id, kind, "", needs)
    }

    /// A `harness` node running `role`.
    #[must_use]
    pub fn harness(self, id: &str, role: &str, needs: &[&str]) -> Self {
        let line = format!("role = {}", string(role));
        self.push(id, "harness", &line, needs)
    }

    /// A `verdict` node parsing node `from`'s output.
    #[must_use]
    pub fn verdict(self, id: &str, from: &str, needs: &[&str]) -> Self {
        let line = format!("from = {}", string(from));
        self.push(id, "verdict", &line, needs)
    }

    /// A `command` node running `argv`.
    #[must_use]
    pub fn command<S: AsRef<str>>(self, id: &str, argv: &[S], needs: &[&str]) -> Self {
        let line = format!("argv = {}", array(argv));
        self.push(id, "command", &line, needs)
    }

    /// A `command` node running the script `program` with `args`.
    #[must_use]
    pub fn script(self, id: &str, program: &Path, args: &[&str], needs: &[&str]) -> Self {
        let mut argv = vec![program.display().to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        self.command(id, &argv, needs)
    }

    /// A `commit` node.
    #[must_use]
    pub fn commit(self, id: &str, needs: &[&str]) -> Self {
        self.node(id, "commit", needs)
    }

    /// A `git-commit` node.
    #[must_use]
    pub fn git_commit(self, id: &str, needs: &[&str]) -> Self {
        self.node(id, "git-commit", needs)
    }

    /// Sets `key = value` lines on the node added last: `with("retries = 2")`.
    #[must_use]
    pub fn with(mut self, lines: &str) -> Self {
        self.nodes
            .last_mut()
            .expect("with() follows a node")
            .set(lines);
        self
    }

    /// Sets `key = value` lines on node `id`.
    #[must_use]
    pub fn set(mut self, id: &str, lines: &str) -> Self {
        let name = format!("nodes.{id}");
        self.nodes
            .iter_mut()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no node {id}"))
            .set(lines);
        self
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Some(top) = &self.top {
            top.render(&mut out);
        }
        for t in &self.nodes {
            if !out.is_empty() {
                out.push('\n');
            }
            t.render(&mut out);
        }
        out
    }
}
