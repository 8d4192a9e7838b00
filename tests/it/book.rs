//! The README and the book (book/src, an mdBook) as a reader meets them: a short README
//! whose first commands are the demo and the tests, a book whose SUMMARY lists every
//! chapter, links that lead somewhere (files and anchors), one repository URL, this
//! version in every `uses:`/`rev:`, and the README's pull-request workflow valid as
//! GitHub reads it. (sarif.rs and contract.rs hold the chapters' tables to the code.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::have;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const REPOSITORY: &str = env!("CARGO_PKG_REPOSITORY");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// README.md and every chapter, as (repository-relative path, text).
fn documents() -> Vec<(String, String)> {
    let mut docs = vec![("README.md".to_string(), read("README.md"))];
    let mut chapters: Vec<_> = std::fs::read_dir(root().join("book/src"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    chapters.sort();
    for c in chapters {
        let rel = format!("book/src/{c}");
        docs.push((rel.clone(), read(&rel)));
    }
    docs
}

#[test]
fn the_readme_is_short_and_starts_with_the_demo_and_the_tests() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines");
    let block: Vec<&str> = readme
        .lines()
        .skip_while(|l| *l != "```sh")
        .skip(1)
        .take_while(|l| *l != "```")
        .collect();
    assert!(block[0].starts_with("cargo run -- demo "), "{block:?}");
    assert!(block[1].starts_with("cargo test "), "{block:?}");
    let install = readme
        .split("## Install")
        .nth(1)
        .expect("an Install section");
    let first: Vec<&str> = install
        .lines()
        .filter(|l| l.starts_with("cargo "))
        .take(2)
        .collect();
    assert_eq!(
        first,
        [
            "cargo install --locked loopflow-cli    # from crates.io, into ~/.cargo/bin",
            "cargo binstall loopflow-cli            # the release binary (Linux musl, macOS), checksummed",
        ]
    );
    assert!(readme.contains("(book/src/sandbox.md#security-model)"));
}

#[test]
fn the_summary_lists_every_chapter() {
    let summary = read("book/src/SUMMARY.md");
    let listed: BTreeSet<String> = summary
        .split("](")
        .skip(1)
        .filter_map(|s| s.split(')').next())
        .map(str::to_string)
        .collect();
    let files: BTreeSet<String> = documents()
        .into_iter()
        .filter_map(|(p, _)| p.strip_prefix("book/src/").map(str::to_string))
        .filter(|p| p != "SUMMARY.md")
        .collect();
    assert_eq!(listed, files);
    for chapter in [
        "getting-started.md",
        "loops-and-pipelines.md",
        "agents.md",
        "sandbox.md",
        "scheduling.md",
        "humans-half.md",
        "check-in-ci.md",
        "telemetry.md",
        "reference.md",
        "troubleshooting.md",
    ] {
        assert!(files.contains(chapter), "{chapter}");
    }
}

/// GitHub's and mdBook's anchor for a heading: lower case, spaces to `-`, punctuation
/// other than `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut set: BTreeSet<String> = text
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect();
    for part in text.split("<a id=\"").skip(1) {
        set.insert(part.split('"').next().unwrap_or("").to_string());
    }
    set
}

/// Every relative link in README.md and the book leads to a file that exists, and to an
/// anchor in it when it names one.
#[test]
fn every_link_leads_somewhere() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for (path, text) in documents() {
        let base = Path::new(&path).parent().unwrap().to_path_buf();
        for part in text.split("](").skip(1) {
            let Some(target) = part.split(')').next() else {
                continue;
            };
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target, None),
            };
            let dest = if file.is_empty() {
                PathBuf::from(&path)
            } else {
                base.join(file)
            };
            checked += 1;
            let full = root().join(&dest);
            if !full.exists() {
                broken.push(format!("{path}: {target} (no {})", dest.display()));
                continue;
            }
            if let Some(a) = anchor {
                let text = std::fs::read_to_string(&full).unwrap_or_default();
                if !anchors(&text).contains(a) {
                    broken.push(format!("{path}: {target} (no anchor #{a})"));
                }
            }
        }
    }
    assert!(checked > 30, "only {checked} links found");
    assert!(broken.is_empty(), "{broken:#?}");
}

/// One repository everywhere, and this version wherever the Action or the hook is pinned.
#[test]
fn the_repository_and_version_are_cargo_tomls_everywhere() {
    let owner_repo = REPOSITORY
        .strip_prefix("https://github.com/")
        .expect("a GitHub repository");
    let mut files = documents();
    for f in ["action.yml", ".pre-commit-hooks.yaml", "book.toml"] {
        files.push((f.to_string(), read(f)));
    }
    let mut wrong = Vec::new();
    for (path, text) in &files {
        for part in text.split("https://github.com/").skip(1) {
            let url: String = part
                .chars()
                .take_while(|c| c.is_alphanumeric() || "-_./".contains(*c))
                .collect();
            let mut segs = url.split('/');
            let here = format!(
                "{}/{}",
                segs.next().unwrap_or(""),
                segs.next().unwrap_or("")
            );
            if here != owner_repo {
                wrong.push(format!("{path}: https://github.com/{url}"));
            }
        }
        for part in text.split(&format!("{owner_repo}@")).skip(1) {
            if !part.starts_with(&format!("v{VERSION}")) {
                wrong.push(format!(
                    "{path}: {owner_repo}@{}",
                    &part[..part.len().min(12)]
                ));
            }
        }
        for line in text.lines().filter(|l| {
            l.trim_start()
                .trim_start_matches("# ")
                .starts_with("rev: v")
        }) {
            if !line.ends_with(&format!("rev: v{VERSION}")) {
                wrong.push(format!("{path}: {line}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The pull-request workflow of README and the book: the same ten lines, valid as GitHub
/// reads them, and using only inputs the Action has.
#[test]
fn the_pull_request_workflow_is_ten_valid_lines() {
    let block = |text: &str| -> String {
        text.split("```yaml\non: pull_request\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .map(|b| format!("on: pull_request\n{b}"))
            .expect("a pull-request workflow")
    };
    let readme = block(&read("README.md"));
    assert_eq!(readme, block(&read("book/src/check-in-ci.md")));
    assert!(readme.lines().count() <= 10, "{readme}");
    let action = read("action.yml");
    // The one input the workflow gives the Action is one it has.
    assert!(readme.contains("with: { sarif: "), "{readme}");
    assert!(
        action.contains("\n  sarif:\n"),
        "action.yml has no input sarif"
    );
    if have("actionlint") && have("shellcheck") {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("loopflow.yml");
        std::fs::write(&f, &readme).unwrap();
        let o = Command::new("actionlint").arg(&f).output().unwrap();
        assert!(
            o.status.success(),
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// Where a text points a reader at something they cannot open: a design document that
/// does not ship, or an issue of a tracker by number.
fn points_away(text: &str) -> Vec<String> {
    let lower = text.to_lowercase();
    let mut found = Vec::new();
    for needle in ["design.md", "design §"] {
        if lower.contains(needle) {
            found.push(needle.to_string());
        }
    }
    let words: Vec<&str> = lower.split_whitespace().collect();
    for w in words.windows(2) {
        let number = |s: &str| {
            let s = s.trim_start_matches(['#', '(']);
            s.chars().next().is_some_and(|c| c.is_ascii_digit())
        };
        if matches!(w[0], "issue" | "issues" | "(issue") && number(w[1]) {
            found.push(format!("{} {}", w[0], w[1]));
        }
    }
    for (i, _) in lower.match_indices('#') {
        let before = lower[..i].chars().next_back();
        let after = lower[i + 1..].chars().next();
        if matches!(before, None | Some(' ' | '(')) && after.is_some_and(|c| c.is_ascii_digit()) {
            found.push(lower[i..].chars().take(6).collect());
        }
    }
    found
}

/// The project's pages stand on their own: README, book, contracts, presets, templates,
/// schemas and every command's `--help` name no design document that does not ship and
/// no issue by number.
#[test]
fn the_pages_name_no_design_document_and_no_issue_number() {
    let mut files: Vec<PathBuf> = vec![root().join("README.md")];
    let mut dirs = vec![
        root().join("book/src"),
        root().join("contracts"),
        root().join("presets"),
        root().join("templates"),
        root().join("schemas"),
        root().join("pipelines"),
        root().join("prompts"),
    ];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    let mut bad = Vec::new();
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for found in points_away(&text) {
            bad.push(format!("{}: {found}", f.display()));
        }
    }
    // Every command's help, found from the binary's own.
    let help = |args: &[&str]| {
        let o = Command::new(crate::support::bin())
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let commands = |text: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|c| *c != "help")
            .map(str::to_string)
            .collect()
    };
    let top = help(&[]);
    let mut helps = vec![("loopflow".to_string(), top.clone())];
    for c in commands(&top) {
        let text = help(&[&c]);
        for s in commands(&text) {
            helps.push((format!("{c} {s}"), help(&[&c, &s])));
        }
        helps.push((c, text));
    }
    assert!(helps.len() > 30, "{}", helps.len());
    for (cmd, text) in &helps {
        for found in points_away(text) {
            bad.push(format!("`{cmd} --help`: {found}"));
        }
    }
    assert!(
        bad.is_empty(),
        "pages that do not stand alone:\n{}",
        bad.join("\n")
    );
    // The check itself finds what it is for.
    assert_eq!(points_away("see DESIGN.md §3"), ["design.md"]);
    assert_eq!(points_away("fixed in issue 23"), ["issue 23"]);
    assert_eq!(points_away("as (#42) says"), ["#42) s"]);
    assert!(points_away("`#:schema` and color #fff, iteration 4").is_empty());
}
