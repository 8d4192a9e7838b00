//! SARIF 2.1.0 for GitHub code scanning: one rule per code (with its description and
//! how to fix it), and locations relative to `%SRCROOT%`, percent-encoded.

use super::{Code, Diagnostics, Severity};

/// SARIF 2.1.0 with one rule per code, so code scanning can track findings across runs.
pub(super) fn render_sarif(diags: &Diagnostics) -> String {
    let rules: Vec<_> = Code::ALL
        .iter()
        .map(|c| {
            serde_json::json!({
                "id": c.as_str(),
                "name": c.as_str(),
                "shortDescription": { "text": c.description() },
            })
        })
        .collect();
    let results: Vec<_> = diags
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
            serde_json::json!({
                "ruleId": d.code.as_str(),
                "ruleIndex": rule_index,
                "level": match d.severity { Severity::Error => "error", Severity::Warning => "warning" },
                "message": { "text": text },
                "locations": [{
                    "physicalLocation": {
                        "artifactLocation": { "uri": d.source.name.replace('\\', "/") },
                        "region": {
                            "startLine": line, "startColumn": col,
                            "endLine": end_line, "endColumn": end_col,
                        }
                    }
                }]
            })
        })
        .collect();
    let doc = serde_json::json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": {
                "name": "loopflow",
                "version": env!("CARGO_PKG_VERSION"),
                "informationUri": "https://github.com/loopflow/loopflow",
                "rules": rules,
            }},
            "results": results,
            // Columns count characters, as in every other format.
            "columnKind": "unicodeCodePoints",
        }]
    });
    let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
    s.push('\n');
    s
}
