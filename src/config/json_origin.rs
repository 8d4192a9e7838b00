//! Where the pieces of a predecessor `loop.json` went when it was rewritten as TOML: every
//! key and value of the JSON, by path, matched to the same path in the TOML, so a finding
//! about the TOML is shown at the JSON the user wrote (see [`crate::diag::Origin`]).

use std::ops::Range;

use toml::de::{DeTable, DeValue};

/// One step of a path: an object key or an array index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Step {
    Key(String),
    Index(usize),
}

/// A key or a value at a path, with its span.
type Piece = (Vec<Step>, bool, Range<usize>);

/// The (TOML span, JSON span) pairs for every key and value both texts hold.
pub(super) fn spans(json: &str, toml: &str) -> Vec<(Range<usize>, Range<usize>)> {
    let mut from_json = Vec::new();
    let mut scan = Scan {
        text: json.as_bytes(),
        at: 0,
    };
    if scan.value(&mut Vec::new(), &mut from_json).is_none() {
        return Vec::new();
    }
    let Ok(doc) = DeTable::parse(toml) else {
        return Vec::new();
    };
    let mut from_toml = Vec::new();
    toml_table(doc.get_ref(), &mut Vec::new(), &mut from_toml);
    // By path: linear in the pieces. A key given twice maps to its last occurrence, the
    // one serde_json (and so the TOML) kept.
    let by_path: std::collections::HashMap<(Vec<Step>, bool), Range<usize>> = from_json
        .into_iter()
        .map(|(path, key, span)| ((path, key), span))
        .collect();
    from_toml
        .into_iter()
        .filter_map(|(path, key, t)| Some((t, by_path.get(&(path, key))?.clone())))
        .collect()
}

fn toml_table(t: &DeTable<'_>, path: &mut Vec<Step>, out: &mut Vec<Piece>) {
    for (k, v) in t {
        path.push(Step::Key(k.get_ref().to_string()));
        out.push((path.clone(), true, k.span()));
        toml_value(v.get_ref(), v.span(), path, out);
        path.pop();
    }
}

fn toml_value(v: &DeValue<'_>, span: Range<usize>, path: &mut Vec<Step>, out: &mut Vec<Piece>) {
    out.push((path.clone(), false, span));
    match v {
        DeValue::Table(t) => toml_table(t, path, out),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(Step::Index(i));
                toml_value(item.get_ref(), item.span(), path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// A scanner over JSON that serde_json already accepted: spans of every key and value.
struct Scan<'a> {
    text: &'a [u8],
    at: usize,
}

impl Scan<'_> {
    fn blanks(&mut self) {
        while self.text.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn value(&mut self, path: &mut Vec<Step>, out: &mut Vec<Piece>) -> Option<()> {
        self.blanks();
        let start = self.at;
        match *self.text.get(self.at)? {
            b'{' => {
                self.at += 1;
                loop {
                    self.blanks();
                    match *self.text.get(self.at)? {
                        b'}' => {
                            self.at += 1;
                            break;
                        }
                        b',' => self.at += 1,
                        b'"' => {
                            let key = self.string()?;
                            let name = decode(&self.text[key.clone()])?;
                            path.push(Step::Key(name));
                            out.push((path.clone(), true, key));
                            self.blanks();
                            (self.text.get(self.at) == Some(&b':')).then_some(())?;
                            self.at += 1;
                            self.value(path, out)?;
                            path.pop();
                        }
                        _ => return None,
                    }
                }
            }
            b'[' => {
                self.at += 1;
                let mut i = 0;
                loop {
                    self.blanks();
                    match *self.text.get(self.at)? {
                        b']' => {
                            self.at += 1;
                            break;
                        }
                        b',' => self.at += 1,
                        _ => {
                            path.push(Step::Index(i));
                            self.value(path, out)?;
                            path.pop();
                            i += 1;
                        }
                    }
                }
            }
            b'"' => {
                self.string()?;
            }
            _ => {
                // A number, true, false or null: up to the next delimiter.
                while self
                    .text
                    .get(self.at)
                    .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace())
                {
                    self.at += 1;
                }
                if self.at == start {
                    return None;
                }
            }
        }
        out.push((path.clone(), false, start..self.at));
        Some(())
    }

    /// A string literal from its opening quote; its span, quotes included.
    fn string(&mut self) -> Option<Range<usize>> {
        let start = self.at;
        self.at += 1;
        loop {
            match *self.text.get(self.at)? {
                b'\\' => self.at += 2,
                b'"' => {
                    self.at += 1;
                    return Some(start..self.at);
                }
                _ => self.at += 1,
            }
        }
    }
}

/// A JSON string literal's value.
fn decode(literal: &[u8]) -> Option<String> {
    serde_json::from_slice(literal).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_are_matched_by_path() {
        let json = "{\n  \"brakes\": {\"max_iterations\": \"ten\", \"w\": [1, 2]},\n  \"k\\u0041\": true\n}";
        let toml = super::super::json_to_toml(json).unwrap();
        let pairs = spans(json, &toml);
        let at = |needle: &str, in_toml: bool| {
            pairs
                .iter()
                .find(|(t, j)| {
                    let (text, span) = if in_toml {
                        (&toml, t)
                    } else {
                        (&json.to_string(), j)
                    };
                    &text[span.clone()] == needle
                })
                .cloned()
        };
        // The value "ten" and the key max_iterations, in both.
        let (t, j) = at("\"ten\"", true).expect("ten");
        assert_eq!(&json[j], "\"ten\"");
        assert_eq!(&toml[t], "\"ten\"");
        let (_, j) = at("max_iterations", true).expect("key");
        assert_eq!(&json[j], "\"max_iterations\"");
        // Array items by index, and an escaped key by its value.
        let (_, j) = at("2", true).expect("array item");
        assert_eq!(&json[j], "2");
        let (_, j) = at("kA", true).expect("escaped key");
        assert_eq!(&json[j], "\"k\\u0041\"");
    }

    #[test]
    fn malformed_json_maps_nothing() {
        assert!(spans("{\"a\": ", "a = 1").is_empty());
        assert!(spans("", "").is_empty());
    }
}
