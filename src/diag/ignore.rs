//! `# loopflow: ignore[code, …]` comments: on the line above a finding, they silence the
//! findings with those codes that start on the next line. A comment that silences
//! nothing (a stale one, a misspelt code, a code that cannot be ignored) is itself a
//! warning, so suppressions do not outlive the problems they were written for.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use super::{Code, Diagnostic, SourceRef, suggest};

const MARK: &str = "loopflow: ignore[";

/// One comment: the line it is on (1-based) and each code it names, with its span.
#[derive(Debug)]
pub(super) struct Ignore {
    source: SourceRef,
    line: usize,
    codes: Vec<(String, Range<usize>)>,
    used: Vec<bool>,
}

/// The ignore comments of a file, in order. Cheap on files without any.
pub(super) fn scan(source: &SourceRef) -> Vec<Ignore> {
    let text = source.text.as_str();
    if !text.contains(MARK) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut offset = 0;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let start = offset;
        offset += line.len();
        let trimmed = line.trim_start();
        let Some(rest) = trimmed.strip_prefix('#') else {
            continue;
        };
        let rest_trim = rest.trim_start();
        let Some(list) = rest_trim.strip_prefix(MARK) else {
            continue;
        };
        let Some(close) = list.find(']') else {
            continue;
        };
        let list_at = start + (line.len() - list.len());
        let mut codes = Vec::new();
        let mut pos = 0;
        for part in list[..close].split(',') {
            let lead = part.len() - part.trim_start().len();
            let name = part.trim();
            if !name.is_empty() {
                let s = list_at + pos + lead;
                codes.push((name.to_string(), s..s + name.len()));
            }
            pos += part.len() + 1;
        }
        if !codes.is_empty() {
            out.push(Ignore {
                source: source.clone(),
                line: i + 1,
                used: vec![false; codes.len()],
                codes,
            });
        }
    }
    out
}

/// Drops the findings an ignore comment covers and adds an `unused-ignore` warning for
/// every code of a comment that covered nothing.
pub(super) fn apply(items: &mut Vec<Diagnostic>, ignores: &mut [Ignore]) {
    if ignores.is_empty() {
        return;
    }
    // (file, line a comment applies to) → the comment.
    let at: HashMap<(usize, usize), usize> = ignores
        .iter()
        .enumerate()
        .map(|(i, g)| ((Arc::as_ptr(&g.source) as usize, g.line + 1), i))
        .collect();
    items.retain(|d| {
        if !d.code.ignorable() {
            return true;
        }
        let key = (Arc::as_ptr(&d.source) as usize, d.start().0);
        let Some(&i) = at.get(&key) else {
            return true;
        };
        let g = &mut ignores[i];
        match g.codes.iter().position(|(c, _)| c == d.code.as_str()) {
            Some(k) => {
                g.used[k] = true;
                false
            }
            None => true,
        }
    });
    for g in ignores.iter() {
        for ((name, span), used) in g.codes.iter().zip(&g.used) {
            if !used {
                items.push(unused(&g.source, name, span.clone()));
            }
        }
    }
}

fn unused(source: &SourceRef, name: &str, span: Range<usize>) -> Diagnostic {
    let d = Diagnostic::warning(
        Code::UnusedIgnore,
        source,
        span,
        format!("`# loopflow: ignore[{name}]` silences nothing"),
    );
    match Code::parse(name) {
        None => {
            let near = suggest(name, Code::ALL.iter().map(|c| c.as_str()));
            d.label("not a loopflow diagnostic code").help(match near {
                Some(n) => format!("did you mean `{n}`?"),
                None => "use a code shown in brackets by `loopflow check`, e.g. `unknown-key`"
                    .to_string(),
            })
        }
        Some(c) if !c.ignorable() => d
            .label("this code cannot be ignored")
            .help(format!(
                "`{c}` is an error loopflow cannot run with; fix the problem instead of ignoring it"
            )),
        Some(c) => d
            .label(format!("nothing on the next line reports `{c}`"))
            .help("remove the comment (the problem it was for is gone), or move it to the line above the finding"),
    }
}
