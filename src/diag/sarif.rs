//! SARIF 2.1.0 for GitHub code scanning: one rule per code (with its description and how
//! to fix it), and locations relative to `%SRCROOT%` (the project root), percent-encoded.
//! Links point only at a real place: the repository named in Cargo.toml at build time,
//! when there is one; without it no URI is made up.

use std::path::{Path, PathBuf};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Value, json};

use super::{Code, Diagnostic, Diagnostics, Severity};

/// What may stay unescaped in a relative URI path: RFC 3986's unreserved characters and
/// the segment separator. Everything else (space, `%`, `#`, `?`, `:`, non-ASCII) is escaped.
const PATH: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// `CARGO_PKG_REPOSITORY` when Cargo.toml names a repository (Cargo sets it empty when
/// it does not).
fn repository() -> Option<&'static str> {
    option_env!("CARGO_PKG_REPOSITORY")
        .map(|r| r.trim_end_matches('/'))
        .filter(|r| r.starts_with("https://"))
}

/// Where a rule's help lives: the book's "Diagnostic codes" table (book/src/reference.md,
/// one anchor per code) at this version's
/// tag, for a repository on GitHub (whose `/blob/<tag>/` URLs are known to exist for a
/// released tag). Elsewhere nothing is guessed.
fn help_uri(code: Code) -> Option<String> {
    let repo = repository().filter(|r| r.starts_with("https://github.com/"))?;
    Some(format!(
        "{repo}/blob/v{}/book/src/reference.md#{}",
        env!("CARGO_PKG_VERSION"),
        code.as_str()
    ))
}

/// `toml-syntax` → `TomlSyntax`: SARIF's friendly rule name.
fn pascal(code: &str) -> String {
    code.split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn rule(c: Code) -> Value {
    // The codes `check` reports as warnings; every other one is an error.
    let level = if matches!(
        c,
        Code::LegacyPlaceholder | Code::UnreachableNode | Code::UnusedIgnore
    ) {
        "warning"
    } else {
        "error"
    };
    let mut r = json!({
        "id": c.as_str(),
        "name": pascal(c.as_str()),
        "shortDescription": { "text": c.description() },
        "fullDescription": { "text": format!("{} {}", c.description(), c.fix()) },
        "help": {
            "text": format!("{}\n\nHow to fix: {}", c.description(), c.fix()),
            "markdown": format!(
                "**{}** (`{}`)\n\n**How to fix:** {}\n\n{}",
                c.description(),
                c.as_str(),
                c.fix(),
                if c.ignorable() {
                    format!("Silence one finding with `# loopflow: ignore[{}]` on the line above it.", c.as_str())
                } else {
                    "This rule cannot be silenced with `# loopflow: ignore[…]`: fix the problem.".to_string()
                }
            ),
        },
        "defaultConfiguration": { "level": level },
    });
    if let Some(u) = help_uri(c) {
        r["helpUri"] = u.into();
    }
    r
}

/// `file://` URI of an absolute directory, ending in `/` as SARIF requires of a base.
fn dir_uri(dir: &Path) -> String {
    let mut p = dir.to_string_lossy().replace('\\', "/");
    if !p.starts_with('/') {
        p.insert(0, '/'); // `C:/x` → `/C:/x`
    }
    if !p.ends_with('/') {
        p.push('/');
    }
    format!("file://{}", utf8_percent_encode(&p, PATH))
}

/// The artifact location of a diagnostic's file: relative to `%SRCROOT%` when the file is
/// under it, else an absolute `file://` URI.
fn location(d: &Diagnostic, root: &Path, cwd: &Path) -> Value {
    let path: PathBuf = if d.source.path.is_absolute() {
        d.source.path.clone()
    } else {
        cwd.join(&d.source.path)
    };
    let path = crate::fs_safe::normalize(&path);
    match path.strip_prefix(root) {
        Ok(rel) if !rel.as_os_str().is_empty() => json!({
            "uri": utf8_percent_encode(&rel.to_string_lossy().replace('\\', "/"), PATH).to_string(),
            "uriBaseId": "%SRCROOT%",
        }),
        _ => {
            let s = dir_uri(&path);
            json!({ "uri": s.trim_end_matches('/') })
        }
    }
}

/// SARIF 2.1.0 with one rule per code, so code scanning can track findings across runs.
/// `root` is `%SRCROOT%`, the directory result paths are relative to.
pub(crate) fn render_sarif(diags: &Diagnostics, root: &Path) -> String {
    let cwd = std::env::current_dir().unwrap_or_default();
    let root = crate::fs_safe::normalize(&if root.is_absolute() {
        root.to_path_buf()
    } else {
        cwd.join(root)
    });
    let rules: Vec<Value> = Code::ALL.iter().map(|&c| rule(c)).collect();
    let results: Vec<Value> = diags
        .items
        .iter()
        .map(|d| {
            let (line, col) = d.start();
            let (end_line, end_col) = d.end();
            let mut text = d.message.clone();
            if let Some(h) = &d.help {
                text.push_str(" (help: ");
                text.push_str(h);
                text.push(')');
            }
            let rule_index = Code::ALL.iter().position(|c| *c == d.code).unwrap_or(0);
            json!({
                "ruleId": d.code.as_str(),
                "ruleIndex": rule_index,
                "level": match d.severity { Severity::Error => "error", Severity::Warning => "warning" },
                "message": { "text": text },
                "locations": [{
                    "physicalLocation": {
                        "artifactLocation": location(d, &root, &cwd),
                        "region": {
                            "startLine": line, "startColumn": col,
                            "endLine": end_line, "endColumn": end_col,
                        }
                    }
                }]
            })
        })
        .collect();
    let mut driver = json!({
        "name": "loopflow",
        "version": env!("CARGO_PKG_VERSION"),
        "semanticVersion": env!("CARGO_PKG_VERSION"),
        "rules": rules,
    });
    if let Some(repo) = repository() {
        driver["informationUri"] = repo.into();
    }
    let doc = json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": driver },
            "originalUriBaseIds": { "%SRCROOT%": { "uri": dir_uri(&root) } },
            "results": results,
            // Columns count characters, as in every other format.
            "columnKind": "unicodeCodePoints",
        }]
    });
    let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Source;

    fn uri_of(path: &str, root: &str) -> Value {
        let src = Source::new(path, path, "x = 1\n");
        let mut d = Diagnostics::default();
        d.push(Diagnostic::error(Code::UnknownKey, &src, 0..1, "m"));
        let doc: Value = serde_json::from_str(&render_sarif(&d, Path::new(root))).expect("json");
        doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"].clone()
    }

    #[test]
    fn paths_are_relative_to_srcroot_and_percent_encoded() {
        let l = uri_of("/p/dir/a b%#é.toml", "/p");
        assert_eq!(l["uri"], "dir/a%20b%25%23%C3%A9.toml");
        assert_eq!(l["uriBaseId"], "%SRCROOT%");
        let l = uri_of("/elsewhere/x y.toml", "/p");
        assert_eq!(l["uri"], "file:///elsewhere/x%20y.toml");
        assert!(l.get("uriBaseId").is_none());
    }

    #[test]
    fn rule_names_are_pascal_case() {
        assert_eq!(pascal("variable-not-available"), "VariableNotAvailable");
    }
}
