//! Handlebars templates: where a template came from (so a character range maps back to
//! its file), the rendering engine (strict, no HTML escaping), the static scanner that
//! finds every variable a template uses, and the variable contract (DESIGN §5) that the
//! renderer and `check` share.

mod bytes;
mod compile;
mod engine;
mod scan;
pub(crate) mod vars;

pub(crate) use engine::{RenderError, engine, render, truthy};
pub(crate) use scan::{HELPERS, Usage, legacy_placeholders, scan};

use std::ops::Range;

use crate::diag::SourceRef;

/// Where a template's text lives, so a range inside the text maps back to the file.
#[derive(Debug, Clone)]
pub enum Origin {
    /// A TOML string literal at this span.
    Literal(Range<usize>),
    /// A whole file (a prompt): offsets map one to one.
    File,
    /// Built into loopflow (the default harness): no user file to point at or check.
    Builtin,
}

/// A template together with where it came from.
#[derive(Debug, Clone)]
pub struct Tmpl {
    pub text: String,
    pub source: SourceRef,
    pub origin: Origin,
}

impl Tmpl {
    pub fn literal(source: &SourceRef, text: &str, span: Range<usize>) -> Self {
        Tmpl {
            text: text.to_string(),
            source: source.clone(),
            origin: Origin::Literal(span),
        }
    }

    /// A template loopflow supplies itself; never checked against a user's file.
    pub fn builtin(source: &SourceRef, text: &str) -> Self {
        Tmpl {
            text: text.to_string(),
            source: source.clone(),
            origin: Origin::Builtin,
        }
    }

    pub fn is_builtin(&self) -> bool {
        matches!(self.origin, Origin::Builtin)
    }

    pub fn file(source: &SourceRef) -> Self {
        Tmpl {
            text: source.text.clone(),
            source: source.clone(),
            origin: Origin::File,
        }
    }

    /// The file span of characters `range` of the template text.
    pub fn span_of(&self, range: Range<usize>) -> Range<usize> {
        match &self.origin {
            Origin::File => range,
            Origin::Builtin => 0..0,
            Origin::Literal(lit) => inner_span(&self.source, lit, &self.text, range),
        }
    }

    /// The span of the whole template (the literal, or the first line of a file).
    pub fn whole_span(&self) -> Range<usize> {
        match &self.origin {
            Origin::Literal(lit) => lit.clone(),
            Origin::Builtin => 0..0,
            Origin::File => 0..self.text.find('\n').unwrap_or(self.text.len()),
        }
    }
}

/// The byte span inside a TOML string literal of the characters `range` of its value,
/// when the literal spells the value out without escapes (the common case). Otherwise
/// the whole literal.
pub(crate) fn inner_span(
    source: &SourceRef,
    literal: &Range<usize>,
    value: &str,
    range: Range<usize>,
) -> Range<usize> {
    let raw = source.text.get(literal.clone()).unwrap_or("");
    for quote in ["\"\"\"", "'''", "\"", "'"] {
        if raw.len() >= 2 * quote.len() && raw.starts_with(quote) && raw.ends_with(quote) {
            let inner = &raw[quote.len()..raw.len() - quote.len()];
            if inner == value {
                let base = literal.start + quote.len();
                return base + range.start..base + range.end;
            }
            break;
        }
    }
    // Escapes in the literal: find the same text in the raw literal instead.
    if let Some(needle) = value.get(range.clone())
        && !needle.is_empty()
        && let Some(pos) = raw.find(needle)
    {
        return literal.start + pos..literal.start + pos + needle.len();
    }
    literal.clone()
}
