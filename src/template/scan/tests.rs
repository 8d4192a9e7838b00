//! The scanner: its usages, ranges and errors, and the fast subset scan against the general one.

use super::*;

/// Where the subset path answers, it answers what the general scan does: the shipped
/// prompts and the compile tests' generated templates (blocks nested, paths, `this`,
/// literals, blanks), compared usage by usage.
#[test]
fn the_subset_scan_agrees_with_the_general_scan() {
    let agree = |t: &str| -> bool {
        let Some(paths) = crate::template::compile::plain_paths(t) else {
            return false;
        };
        assert_eq!(Ok(subset_usages(paths)), scan_general(t), "template: {t:?}");
        true
    };
    use crate::template::compile::tests::{PIECES, SHIPPED_PROMPTS, generated};
    for p in SHIPPED_PROMPTS {
        assert!(agree(p), "a shipped prompt left the subset:\n{p}");
    }
    for t in [
        "{{# each  f }}{{x}}{{/each}}{{y}}",
        "{{#\nwith g}}{{y}}{{else}}{{z}}{{/with}}{{w}}",
        "{{#each a}}{{#if b}}{{c}}{{/if}}{{/each}}{{d}}",
    ] {
        assert!(agree(t), "{t:?} left the subset");
    }
    // The compile tests' walk, with pieces that matter to the paths found: `this`,
    // literals, blanks after `#` on each kind of block.
    let mut pieces = PIECES.to_vec();
    pieces.extend([
        "{{# each  f }}",
        "{{#\nwith g}}",
        "{{this.w}}",
        "{{undefined}}",
        "{{a-b.c_d}}",
    ]);
    let all = generated(&pieces, 6000);
    let subset = all.iter().filter(|t| agree(t)).count();
    assert!(
        subset * 3 > all.len() * 2,
        "only {subset} of {} generated templates in the subset",
        all.len()
    );
}

fn paths(t: &str) -> Vec<String> {
    scan(t)
        .unwrap()
        .iter()
        .map(|u| u.path(t).to_string())
        .collect()
}

#[test]
fn finds_plain_and_helper_params() {
    assert_eq!(paths("--p {{prompt}} {{cwd}}"), ["prompt", "cwd"]);
    assert_eq!(
        paths("{{not (eq nodes.tests.exit_code 0)}}"),
        ["nodes.tests.exit_code"]
    );
    assert_eq!(
        paths("{{#if verdict}}x{{else}}{{loop}}{{/if}}"),
        ["verdict", "loop"]
    );
    assert_eq!(
        paths("{{#each reasons}}- {{this}} {{x}}{{/each}}"),
        ["reasons"]
    );
    assert_eq!(
        paths("{{{raw_thing}}} {{~ trimmed ~}}"),
        ["raw_thing", "trimmed"]
    );
    assert_eq!(paths("{{! a comment }}"), Vec::<String>::new());
}

#[test]
fn ranges_point_at_the_name() {
    let t = "a {{ verdict }} b";
    let u = scan(t).unwrap();
    assert_eq!(&t[u[0].range.clone()], "verdict");
    let t = "{{not (eq nodes.x.exit_code 0)}}";
    let u = scan(t).unwrap();
    assert_eq!(&t[u[0].range.clone()], "nodes.x.exit_code");
}

#[test]
fn unknown_helper_and_syntax_errors() {
    assert!(scan("{{frob a b}}").unwrap_err().message.contains("frob"));
    assert!(scan("{{#if a}}").is_err());
}

#[test]
fn unbalanced_blocks_point_at_the_wrong_tag() {
    let e = scan("a {{#if x}}b{{/each}} c").unwrap_err();
    assert_eq!(e.message, "`{{/each}}` closes a `{{#if}}` block");
    assert_eq!(e.range, 12..21);
    // Blanks after `#` or `/` do not change the tag, inside the subset or outside it.
    assert!(scan("{{# if a}}x{{/ if}}").is_ok());
    assert!(scan("{{# if (eq a 1)}}x{{/ if}}").is_ok());
    // ... and `{{# each xs}}` changes the context as `{{#each xs}}` does, in both scans.
    assert_eq!(paths("{{# each items}}{{name}}{{/each}}"), ["items"]);
    assert_eq!(paths("{{# each items}}{{name}}{{/each}}{{!c}}"), ["items"]);
    // Segments read back from the text: brackets dropped, `/` a separator too.
    assert_eq!(
        paths("{{lookup nodes.[a-b].exit_code 0}} {{foo/[b.c]}}"),
        ["nodes.a-b.exit_code", "foo.b.c"]
    );
    let u = scan("{{#if nodes.[t].stdout_path}}{{/if}}").unwrap();
    let t = "{{#if nodes.[t].stdout_path}}{{/if}}";
    let p = u[0].path(t);
    assert_eq!(
        (p.len(), p.root(), p.get(1), p.get(3)),
        (3, "nodes", Some("t"), None)
    );
    let e = scan("{{/if}}").unwrap_err();
    assert_eq!(e.message, "`{{/if}}` has no `{{#if}}` before it");
    let e = scan("x {{#each reasons}}- {{this}}").unwrap_err();
    assert_eq!(e.range, 2..19);
    assert!(e.message.contains("add `{{/each}}`"), "{}", e.message);
    let e = scan("x {{y").unwrap_err();
    assert_eq!(e.range, 2..4);
    // Escaped and balanced ones are fine.
    assert!(scan("\\{{#if}} {{#if a}}{{#unless b}}x{{/unless}}{{/if}}").is_ok());
}

#[test]
fn parser_errors_are_short() {
    let e = scan("{{a b c d (}}").unwrap_err();
    assert!(!e.message.contains("expected escape"), "{}", e.message);
}

#[test]
fn legacy_tokens() {
    let l = legacy_placeholders("--prompt-file {prompt} {{cwd}} {not-a-token");
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].0, "prompt");
}

#[test]
fn plain_mustaches_are_recognised_conservatively() {
    assert!(only_plain_mustaches(
        "--p {{prompt}} {{ nodes.floor-check.exit_code }}"
    ));
    for not_plain in [
        "{{#if x}}y{{/if}}",
        "{{{raw}}}",
        "{{eq a b}}",
        "{{a..b}}",
        "{{.a}}",
        "x}}",
        "\\{{a}}",
        "{{else}}",
        "{{!c}}",
        "{{a}",
    ] {
        assert!(!only_plain_mustaches(not_plain), "{not_plain}");
    }
}
