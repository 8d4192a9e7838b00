//! The graded verdict (DESIGN §7): found in a verifier's stdout as raw JSON, the last
//! ```json fenced block, or JSON after `//` / `#` comment lines; strict keys and ranges.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    /// Whether the work passes verification.
    pub pass: bool,
    /// Graded score from 0.0 to 1.0.
    pub score: f64,
    /// Why the score is what it is; shown to the next implement prompt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// What the next iteration should do first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hint: Option<String>,
    /// Money this tick's agents spent, counted against `max_budget_usd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Tokens this tick's agents used, counted against `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

/// Why a verifier's output is not a verdict.
#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum VerdictError {
    #[error("no JSON verdict found in the verifier's output")]
    NotFound,
    #[error("the verdict is not valid: {0}")]
    Invalid(String),
    #[error("score {0} is outside 0.0–1.0")]
    ScoreOutOfRange(f64),
    #[error("{0} must not be negative")]
    Negative(&'static str),
}

/// Finds and validates the verdict in `text`.
pub(crate) fn parse(text: &str) -> Result<Verdict, VerdictError> {
    let candidate = extract(text).ok_or(VerdictError::NotFound)?;
    let v: Verdict =
        serde_json::from_str(&candidate).map_err(|e| VerdictError::Invalid(e.to_string()))?;
    if !(0.0..=1.0).contains(&v.score) || !v.score.is_finite() {
        return Err(VerdictError::ScoreOutOfRange(v.score));
    }
    if v.cost_usd.is_some_and(|c| !(c >= 0.0 && c.is_finite())) {
        return Err(VerdictError::Negative("cost_usd"));
    }
    Ok(v)
}

fn extract(text: &str) -> Option<String> {
    // 1. The last ```json fenced block.
    if let Some(block) = last_json_fence(text) {
        return Some(block);
    }
    // 2. The whole output, without comment lines, is JSON.
    let uncommented: String = text
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            !(t.starts_with("//") || t.starts_with('#'))
        })
        .collect::<Vec<_>>()
        .join("\n");
    let trimmed = uncommented.trim();
    if trimmed.starts_with('{') && serde_json::from_str::<serde_json::Value>(trimmed).is_ok() {
        return Some(trimmed.to_string());
    }
    // 3. Raw JSON as the last line that is an object on its own (agents often print logs first).
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| {
            l.starts_with('{')
                && l.ends_with('}')
                && serde_json::from_str::<serde_json::Value>(l).is_ok()
        })
        .map(str::to_string)
        .or_else(|| trimmed.starts_with('{').then(|| trimmed.to_string()))
}

fn last_json_fence(text: &str) -> Option<String> {
    let mut found = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.starts_with("```") && t[3..].trim().eq_ignore_ascii_case("json") {
            let mut body = Vec::new();
            for inner in lines.by_ref() {
                if inner.trim() == "```" {
                    break;
                }
                body.push(inner);
            }
            found = Some(body.join("\n"));
        }
    }
    found
}

/// A score as the log shows it: at most 4 decimals, at least one (`0.5`, `1.0`).
pub(crate) fn fmt_score(s: f64) -> String {
    let t = format!("{s:.4}");
    let t = t.trim_end_matches('0');
    if t.ends_with('.') {
        format!("{t}0")
    } else {
        t.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_fenced_and_commented() {
        assert_eq!(parse(r#"{"pass": true, "score": 0.9}"#).unwrap().score, 0.9);
        let fenced = "thinking...\n```json\n{\"pass\": false, \"score\": 0.1}\n```\nmore\n```json\n{\"pass\": true, \"score\": 0.5}\n```\n";
        assert_eq!(parse(fenced).unwrap().score, 0.5);
        let commented = "// graded by verifier\n# second comment\n{\"pass\": true, \"score\": 1.0, \"reasons\": [\"ok\"]}\n";
        assert_eq!(parse(commented).unwrap().reasons, vec!["ok"]);
    }

    #[test]
    fn strict() {
        assert_eq!(parse("garbage").unwrap_err(), VerdictError::NotFound);
        assert!(matches!(
            parse(r#"{"pass": true}"#),
            Err(VerdictError::Invalid(_))
        ));
        assert!(matches!(
            parse(r#"{"pass": "yes", "score": 1}"#),
            Err(VerdictError::Invalid(_))
        ));
        assert!(matches!(
            parse(r#"{"pass": true, "score": 1.5}"#),
            Err(VerdictError::ScoreOutOfRange(_))
        ));
        assert!(matches!(
            parse(r#"{"pass": true, "score": 0.5, "extra": 1}"#),
            Err(VerdictError::Invalid(_))
        ));
    }
}
