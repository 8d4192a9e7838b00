//! `completions` and `man`: the shell completion scripts and man pages, generated from
//! the same clap definition the parser uses, so they never disagree with `--help`.

use clap::Args;

use crate::exit;

pub(super) const COMPLETIONS_HELP: &str = "\
Examples (where each shell looks for them):
  loopflow completions bash > ~/.local/share/bash-completion/completions/loopflow
  loopflow completions zsh > ~/.zfunc/_loopflow     (fpath+=~/.zfunc before compinit in ~/.zshrc)
  loopflow completions fish > ~/.config/fish/completions/loopflow.fish
  loopflow completions powershell >> $PROFILE";

#[derive(Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub(crate) struct ManArgs {
    /// A subcommand whose own page to print (`loopflow-run(1)`, …); default: loopflow(1).
    #[arg(value_name = "COMMAND")]
    pub command: Option<String>,
}

pub(super) fn completions(a: CompletionsArgs) -> i32 {
    let mut cmd = super::command();
    let mut buf = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "loopflow", &mut buf);
    crate::out::write(&buf);
    exit::OK
}

pub(super) fn man(a: ManArgs) -> i32 {
    let cmd = super::command();
    let (page, title) = match &a.command {
        None => (cmd, "loopflow".to_string()),
        Some(name) => {
            let Some(sub) = cmd
                .get_subcommands()
                .find(|s| s.get_name() == name && !s.is_hide_set())
            else {
                let names: Vec<&str> = cmd
                    .get_subcommands()
                    .filter(|s| !s.is_hide_set())
                    .map(|s| s.get_name())
                    .collect();
                eprintln!(
                    "error: no command `{name}`; the commands are: {}",
                    names.join(", ")
                );
                return exit::USAGE;
            };
            // `loopflow-run(1)`, as git names `git-log(1)`.
            (sub.clone(), format!("loopflow-{name}"))
        }
    };
    match render_man(page, title) {
        Ok(roff) => {
            crate::out::write(roff.as_bytes());
            exit::OK
        }
        Err(e) => {
            eprintln!("error: cannot render the man page: {e}");
            exit::STATE
        }
    }
}

/// One man page: clap_mangen's sections, then the help's closing text as sections of
/// their own (EXAMPLES, EXIT STATUS, NOTES) in no-fill mode, so example lines keep their
/// shape (clap_mangen would reflow them under "EXTRA").
fn render_man(cmd: clap::Command, title: String) -> std::io::Result<String> {
    let after = cmd
        .get_after_long_help()
        .or(cmd.get_after_help())
        .map(|h| h.to_string());
    let has_subcommands = cmd.get_subcommands().any(|s| !s.is_hide_set());
    let man = clap_mangen::Man::new(cmd)
        .title(title)
        .source(concat!("loopflow ", env!("CARGO_PKG_VERSION")))
        .manual("loopflow manual");
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    man.render_name_section(&mut buf)?;
    man.render_synopsis_section(&mut buf)?;
    man.render_description_section(&mut buf)?;
    man.render_options_section(&mut buf)?;
    if has_subcommands {
        man.render_subcommands_section(&mut buf)?;
    }
    let mut roff = String::from_utf8_lossy(&buf).into_owned();
    for para in after.as_deref().unwrap_or("").split("\n\n") {
        // Examples keep their lines (no-fill); prose is filled.
        let (head, body, literal) = match para.split_once('\n') {
            Some((h, b)) if h.starts_with("Examples") => ("EXAMPLES", b, true),
            _ if para.starts_with("Exit codes") => ("EXIT STATUS", para, false),
            _ => ("NOTES", para, false),
        };
        if body.trim().is_empty() {
            continue;
        }
        roff.push_str(&format!(".SH \"{head}\"\n"));
        roff.push_str(if literal { ".nf\n" } else { ".PP\n" });
        for line in body.lines() {
            roff.push_str(&roff_line(if literal { line } else { line.trim() }));
            roff.push('\n');
        }
        if literal {
            roff.push_str(".fi\n");
        }
    }
    Ok(ascii_roff(&roff))
}

/// A line of literal text for roff: backslashes and hyphens escaped, and a leading `.`
/// or `'` kept from being read as a request.
fn roff_line(line: &str) -> String {
    let mut out = String::new();
    if line.starts_with(['.', '\'']) {
        out.push_str("\\&");
    }
    for c in line.chars() {
        match c {
            '\\' => out.push_str("\\e"),
            '-' => out.push_str("\\-"),
            c => out.push(c),
        }
    }
    out
}

/// groff reads its input as Latin-1 unless `preconv` runs first: every non-ASCII
/// character (`…`, `→`, `—` in the help) is written as `\[uXXXX]`, which every groff
/// and mandoc reads the same.
fn ascii_roff(roff: &str) -> String {
    let mut out = String::with_capacity(roff.len());
    for c in roff.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&format!("\\[u{:04X}]", c as u32));
        }
    }
    out
}
