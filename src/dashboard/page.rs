//! The page: one template for the live dashboard and the static `report --html`. Every
//! value is escaped on its way in (agent text may hold `<script>`), numbers are rounded for
//! people, and the score chart is inline SVG: no external asset, no CDN. The live page
//! differs only by its script (`/app.js`) and a live marker.

use std::fmt::Write as _;

use super::data::{LoopView, Point, Standing, total_deaths};
use crate::human::{command, count, score, seconds, usd};
use crate::reason::{Death, HaltReason};
use crate::row::Row;

const STYLE: &str = include_str!("style.css");

/// Escapes text for HTML element content and attribute values; what a terminal would not
/// show as it is ([`crate::out::is_unsafe`]: controls, line separators, bidi overrides,
/// invisible format characters) an agent may have written becomes U+FFFD.
pub(super) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    let mut rest = s;
    loop {
        // Runs of printable ASCII that needs no entity are copied whole.
        let plain = rest
            .bytes()
            .position(|b| {
                !matches!(b, b' '..=b'~' | b'\n' | b'\t')
                    || matches!(b, b'&' | b'<' | b'>' | b'"' | b'\'')
            })
            .unwrap_or(rest.len());
        out.push_str(&rest[..plain]);
        rest = &rest[plain..];
        let Some(c) = rest.chars().next() else {
            return out;
        };
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if crate::out::is_unsafe(c) && c != '\n' && c != '\t' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
}

/// Whether the page is served live (with its script) or written once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Live,
    Static,
}

fn death_label(d: Death) -> &'static str {
    match d {
        Death::IterationsExhausted => "iterations exhausted",
        Death::BudgetExhausted => "budget exhausted",
        Death::VerifierFailed => "verifier failed",
        Death::HumanIntervention => "human intervention",
        Death::GoalMet => "goal met",
    }
}

/// The class and text of a loop's badge: a goal met is good news, not a failure.
fn badge(v: &LoopView) -> (&'static str, &'static str, String) {
    match (v.standing(), v.halt_reason()) {
        (Standing::Halted, Some(HaltReason::GoalMet)) => ("goal", "b-goal", "goal met".into()),
        (Standing::Halted, Some(HaltReason::Closed)) => ("goal", "b-goal", "closed".into()),
        (Standing::Halted, Some(r)) if r.death() == Death::HumanIntervention => {
            ("human", "b-human", format!("needs you · {r}"))
        }
        (Standing::Halted, r) => (
            "halted",
            "b-halt",
            format!(
                "halted · {}",
                r.map(ToString::to_string).unwrap_or_default()
            ),
        ),
        (Standing::Broken, _) => ("broken", "b-broken", "broken".into()),
        (Standing::Running, _) => ("running", "b-run", "running".into()),
        (Standing::Ready, _) => match v.row.as_ref().and_then(|r| r.skipping.as_ref()) {
            Some(k) => (
                "broken",
                "b-broken",
                format!("every tick skips · {}", k.reason),
            ),
            None => ("ready", "b-ready", "ready".into()),
        },
    }
}

/// `2026-11-30T02:10:00Z` as `2026-11-30 02:10Z`.
fn short_time(t: &str) -> String {
    match (t.get(..10), t.get(11..16)) {
        (Some(d), Some(h)) if t.len() >= 16 => format!("{d} {h}Z"),
        _ => t.to_string(),
    }
}

/// Spent against a limit, with a small bar when there is a limit.
fn spend(
    spent: String,
    used: f64,
    limit: Option<f64>,
    limit_text: impl Fn(f64) -> String,
) -> String {
    match limit.filter(|l| *l > 0.0) {
        None => escape(&spent),
        Some(l) => {
            let pct = (used / l * 100.0).clamp(0.0, 100.0);
            format!(
                "{} <small>of {}</small><span class=\"bar{}\"><span style=\"width:{pct:.0}%\"></span></span>",
                escape(&spent),
                escape(&limit_text(l)),
                if pct >= 90.0 { " hot" } else { "" }
            )
        }
    }
}

/// The score chart: the last scores in order, the goal as a dashed line.
pub(super) fn chart(points: &[Point], goal: Option<f64>) -> String {
    let (w, h, pad) = (240.0, 70.0, 6.0);
    let mut s = format!(
        "<svg class=\"chart\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"score over the last {} iterations\">",
        points.len()
    );
    let y = |v: f64| h - pad - v.clamp(0.0, 1.0) * (h - 2.0 * pad);
    if let Some(g) = goal {
        let _ = write!(
            s,
            "<line class=\"goal\" x1=\"0\" x2=\"{w}\" y1=\"{0:.1}\" y2=\"{0:.1}\"/>",
            y(g)
        );
    }
    if points.is_empty() {
        s.push_str("<text x=\"8\" y=\"40\">no verdicts yet</text></svg>");
        return s;
    }
    let step = if points.len() > 1 {
        (w - 2.0 * pad) / (points.len() - 1) as f64
    } else {
        0.0
    };
    let x = |i: usize| {
        if points.len() == 1 {
            w / 2.0
        } else {
            pad + i as f64 * step
        }
    };
    let coords: Vec<String> = points
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{:.1},{:.1}", x(i), y(p.score)))
        .collect();
    let _ = write!(
        s,
        "<polyline class=\"line\" points=\"{}\"/>",
        coords.join(" ")
    );
    let r = if points.len() > 40 { 1.5 } else { 2.5 };
    for (i, p) in points.iter().enumerate() {
        let _ = write!(
            s,
            "<circle class=\"{}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"{r}\"><title>iteration {}: {} {}</title></circle>",
            if p.pass { "pass" } else { "fail" },
            x(i),
            y(p.score),
            p.iteration,
            if p.pass { "pass" } else { "fail" },
            score(p.score)
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.0}\" y=\"12\" text-anchor=\"end\">{}</text></svg>",
        w - 4.0,
        score(points[points.len() - 1].score)
    );
    s
}

fn fact(out: &mut String, k: &str, v_html: &str) {
    let _ = write!(out, "<dt>{}</dt><dd>{v_html}</dd>", escape(k));
}

/// Over many projects, one chip per project: its loops, how many wait for a human, or
/// that it cannot be read. Nothing for one project.
fn projects_line(o: &mut String, views: &[&LoopView]) {
    let mut by: std::collections::BTreeMap<&str, (usize, usize, bool)> = Default::default();
    for v in views {
        let Some(p) = v.project.as_deref() else {
            continue;
        };
        let e = by.entry(p).or_default();
        if v.project_broken {
            e.2 = true;
        } else {
            e.0 += 1;
            e.1 += usize::from(v.standing() == Standing::Halted);
        }
    }
    if by.is_empty() {
        return;
    }
    o.push_str("<div class=\"projects\">");
    for (p, (loops, halted, broken)) in by {
        let (class, what) = match (broken, halted) {
            (true, _) => ("broken", "unreadable".to_string()),
            (false, 0) => ("", format!("{loops} loop(s)")),
            (false, h) => ("needs", format!("{loops} loop(s), {h} halted")),
        };
        let _ = write!(
            o,
            "<span class=\"project {class}\"><b>{}</b> {what}</span>",
            escape(p)
        );
    }
    o.push_str("</div>");
}

/// One loop's card.
pub(super) fn article(v: &LoopView) -> String {
    if v.project_broken {
        return format!(
            "<article class=\"loop broken project-broken\" id=\"loop-{name}\" data-standing=\"broken\"><header><h2>{label}</h2><span class=\"badge b-broken\">project unreadable</span></header><p class=\"problem\">{why}</p><div class=\"next\"><code>{fix}</code></div></article>",
            name = escape(&v.name),
            label = escape(v.project.as_deref().unwrap_or_default()),
            why = escape(v.broken.as_deref().unwrap_or_default()),
            fix = escape(&format!(
                "loopflow projects remove {}",
                crate::human::shell_word(v.project.as_deref().unwrap_or_default())
            )),
        );
    }
    let project = v.dir.as_path();
    let (class, bclass, btext) = badge(v);
    let mut o = String::with_capacity(2048);
    let row = v.row.as_ref();
    let iter = match (
        row.map(|r| r.iteration_count),
        row.and_then(|r| r.max_iterations),
    ) {
        (Some(i), Some(m)) => format!("{i} / {m}"),
        (Some(i), None) => format!("{i} / ?"),
        _ => "– / –".into(),
    };
    let _ = write!(
        o,
        "<article class=\"loop {class}\" id=\"loop-{name}\" data-standing=\"{class}\"><header><h2>{name}</h2><span class=\"badge {bclass}\" title=\"{bt}\">{bt}</span><span class=\"iter\" title=\"iterations used / cap\">{iter}</span></header>",
        name = escape(&v.name),
        bt = escape(&btext),
    );
    o.push_str("<div class=\"body\"><dl class=\"facts\">");
    let task = row.and_then(|r| r.current_task.as_deref()).unwrap_or("–");
    let phase = match row.map(|r| r.current_phase.as_str()) {
        Some(p) if p != "implement" => format!(" <small>({})</small>", escape(p)),
        _ => String::new(),
    };
    fact(
        &mut o,
        "task",
        &format!("<span title=\"{0}\">{0}</span>{phase}", escape(task)),
    );
    let goal = row.and_then(|r| r.goal_score);
    if let Some(sc) = row.and_then(|r| r.last_score) {
        let g = goal
            .map(|g| format!(" <small>goal {}</small>", score(g)))
            .unwrap_or_default();
        fact(&mut o, "score", &format!("{}{g}", score(sc)));
    }
    if let Some(r) = row {
        let limits = r.limits.as_ref();
        let (u, t, s) = (r.spent.usd, r.spent.tokens, r.spent.seconds);
        fact(
            &mut o,
            "spent",
            &spend(usd(u), u, limits.and_then(|l| l.usd), usd),
        );
        // Tokens and time on one line; a unit with neither use nor limit is left out.
        let tokens = limits.and_then(|l| l.tokens).map(|l| l as f64);
        let mut more = Vec::new();
        if t > 0 || tokens.is_some() {
            more.push(spend(
                format!("{} tokens", count(t)),
                t as f64,
                tokens,
                |l| count(l as u64),
            ));
        }
        more.push(spend(
            seconds(s),
            s,
            limits.and_then(|l| l.seconds),
            seconds,
        ));
        fact(&mut o, "used", &more.join(" · "));
    }
    if let Some(t) = row.and_then(|r| r.last_tick_at.as_deref()) {
        fact(&mut o, "last tick", &escape(&short_time(t)));
    }
    o.push_str("</dl>");
    let points: Vec<Point> = v.scan.points.iter().copied().collect();
    o.push_str(&chart(&points, goal));
    o.push_str("</div>");
    if let Some(b) = &v.broken {
        let _ = write!(o, "<p class=\"problem\">{}</p>", escape(b));
    }
    let state = v.state.as_ref();
    if let Some(h) = state.and_then(|s| s.halt.as_ref())
        && let Some(d) = &h.detail
    {
        let _ = write!(
            o,
            "<p class=\"halt-detail{}\">halted at iteration {}, {}: {}</p>",
            if h.reason == HaltReason::GoalMet {
                " goal"
            } else {
                ""
            },
            h.iteration,
            escape(&short_time(&h.at)),
            escape(d)
        );
    }
    if let Some(a) = state.and_then(|s| s.last_abort.as_ref()) {
        let _ = write!(
            o,
            "<p class=\"problem\">last abort, {}: {} {}{}</p>",
            escape(&short_time(&a.at)),
            escape(&a.node),
            escape(&a.reason),
            a.message
                .as_ref()
                .map(|m| format!(": {}", escape(m)))
                .unwrap_or_default()
        );
    }
    if let Some(lv) = state.and_then(|s| s.last_verdict.as_ref()) {
        let pf = if lv.pass { "pass" } else { "fail" };
        let reasons = if lv.reasons.is_empty() {
            "<span class=\"empty\">no reasons given</span>".to_string()
        } else {
            lv.reasons
                .iter()
                .take(3)
                .map(|r| escape(r))
                .collect::<Vec<_>>()
                .join(" · ")
        };
        let _ = write!(
            o,
            "<p class=\"verdict\"><span class=\"pf {pf}\">{pf} {}</span>{reasons}</p>",
            score(lv.score)
        );
    }
    let c = |verb: &str| command(verb, &v.loop_name, project);
    let mut next: Vec<String> = Vec::new();
    match v.standing() {
        Standing::Halted => {
            next.push(c("review"));
            next.push(format!("{} --note \"…\"", c("approve")));
        }
        // A loop whose state is there but whose config is not: `check` says what is wrong.
        Standing::Broken if v.state.is_some() => {
            let cfg = crate::state::LoopPaths::new(project, &v.loop_name).config();
            next.push(format!(
                "loopflow check {}",
                crate::human::shell_word(&cfg.display().to_string())
            ));
        }
        _ if row.is_some_and(|r| r.iteration_count > 0) => next.push(c("review")),
        _ => {}
    }
    if !next.is_empty() {
        o.push_str("<div class=\"next\">");
        for n in next {
            let _ = write!(o, "<code>{}</code>", escape(&n));
        }
        o.push_str("</div>");
    }
    details(&mut o, v, row);
    o.push_str("</article>");
    o
}

/// What is there to read when a human wants more: all reasons, the hint, approvals, the
/// loop's latest log lines. Collapsed, so eight loops fit on a screen or two.
fn details(o: &mut String, v: &LoopView, row: Option<&Row>) {
    o.push_str("<details><summary>details</summary>");
    if let Some(lv) = v.state.as_ref().and_then(|s| s.last_verdict.as_ref()) {
        if !lv.reasons.is_empty() {
            o.push_str("<ul>");
            for r in &lv.reasons {
                let _ = write!(o, "<li>{}</li>", escape(r));
            }
            o.push_str("</ul>");
        }
        if let Some(h) = &lv.next_hint {
            let _ = write!(
                o,
                "<p class=\"verdict\"><b>next hint:</b> {}</p>",
                escape(h)
            );
        }
    }
    if let Some(a) = v.state.as_ref().and_then(|s| s.approvals.last()) {
        let _ = write!(
            o,
            "<p class=\"verdict\"><b>last approval:</b> {} at {}{}</p>",
            escape(&a.by),
            escape(&short_time(&a.at)),
            a.note
                .as_ref()
                .map(|n| format!(": {}", escape(n)))
                .unwrap_or_default()
        );
    }
    for n in row.into_iter().flat_map(|r| &r.notes) {
        let _ = write!(o, "<p class=\"verdict\">note: {}</p>", escape(n));
    }
    if v.scan.partial {
        o.push_str(
            "<p class=\"verdict\">(the log is large: halts are counted in its newest 64 MiB)</p>",
        );
    }
    o.push_str("<pre>");
    for l in &v.scan.tail {
        let _ = writeln!(o, "{}", escape(l));
    }
    if v.scan.tail.is_empty() {
        o.push_str("(no log lines)");
    }
    o.push_str("</pre></details>");
}

/// The counts, the five-deaths audit (totals as tiles; per loop in a table).
pub(super) fn summary(views: &[&LoopView]) -> String {
    let mut by = [0usize; 4];
    for v in views {
        by[v.standing() as usize] += 1;
    }
    let mut o = String::from("<div class=\"counts\">");
    for (n, label) in [
        (views.iter().filter(|v| !v.project_broken).count(), "loops"),
        (by[Standing::Halted as usize], "halted"),
        (by[Standing::Running as usize], "running"),
        (by[Standing::Broken as usize], "broken"),
    ] {
        let _ = write!(
            o,
            "<div class=\"count\"><b>{n}</b><span>{label}</span></div>"
        );
    }
    let usd_total: f64 = views
        .iter()
        .filter_map(|v| Some(v.row.as_ref()?.spent.usd))
        .sum();
    let _ = write!(
        o,
        "<div class=\"count\"><b>{}</b><span>spent</span></div></div>",
        escape(&usd(usd_total))
    );
    let total = total_deaths(views.iter().copied());
    o.push_str(
        "<div class=\"deaths\"><h2>How runs ended: the five deaths</h2><div class=\"tiles\">",
    );
    for (d, n) in Death::ALL.iter().zip(total) {
        let _ = write!(
            o,
            "<div class=\"tile d-{}\" title=\"{}\"><b>{n}</b><span>{}</span></div>",
            d.as_str(),
            d.as_str(),
            death_label(*d)
        );
    }
    o.push_str("</div>");
    let _ = write!(
        o,
        "<details><summary>per loop</summary><table class=\"audit\"><thead><tr><th>loop</th>"
    );
    for d in Death::ALL {
        let _ = write!(o, "<th title=\"{}\">{}</th>", d.as_str(), death_label(d));
    }
    o.push_str("<th>halts</th></tr></thead><tbody>");
    for v in views {
        let _ = write!(o, "<tr><td>{}</td>", escape(&v.name));
        for n in v.scan.deaths {
            let _ = write!(o, "<td>{n}</td>");
        }
        let _ = write!(o, "<td>{}</td></tr>", v.scan.deaths.iter().sum::<u64>());
    }
    o.push_str("</tbody><tfoot><tr><th>total</th>");
    for n in total {
        let _ = write!(o, "<th>{n}</th>");
    }
    let _ = write!(
        o,
        "<th>{}</th></tr></tfoot></table></details></div>",
        total.iter().sum::<u64>()
    );
    projects_line(&mut o, views);
    o
}

/// One line of the log tail: `time loop EVENT rest`.
pub(super) fn log_line(name: &str, line: &str) -> String {
    let (time, rest) = line.split_once(' ').unwrap_or(("", line));
    let (event, args) = rest.split_once(' ').unwrap_or((rest, ""));
    let ev: String = event
        .chars()
        .filter(|c| c.is_ascii_uppercase() || *c == '_')
        .collect();
    format!(
        "<li><span class=\"t\">{}</span> <span class=\"lp\">{}</span> <span class=\"ev-{ev}\">{}</span> {}</li>",
        escape(&short_time(time)),
        escape(name),
        escape(event),
        escape(args)
    )
}

/// The whole page. `cards`: each loop's view and its card as [`article`] rendered it, in
/// page order; `log` the newest lines (loop, line), oldest first; `stamp` the model's
/// (version, log sequence) the page shows, which the live page's script hands back to
/// `/events` so no change in between is lost.
pub(super) fn page(
    title: &str,
    cards: &[(&LoopView, &str)],
    log: &[(String, String)],
    mode: Mode,
    stamp: (u64, u64),
) -> String {
    let title = escape(title);
    let views: Vec<&LoopView> = cards.iter().map(|(v, _)| *v).collect();
    let mut o = String::with_capacity(8192 + cards.iter().map(|(_, h)| h.len()).sum::<usize>());
    let _ = write!(
        o,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>loopflow · {title}</title>\n<style>\n{STYLE}</style>"
    );
    if mode == Mode::Live {
        o.push_str("<script src=\"/app.js\" defer></script>");
    }
    let live = match mode {
        Mode::Live => {
            "<span class=\"live-dot\" id=\"live\" title=\"live: updates as loops tick\"></span>live · "
        }
        Mode::Static => "",
    };
    let _ = write!(
        o,
        "</head><body data-version=\"{}\" data-seq=\"{}\">\n<header class=\"top\"><h1>loopflow</h1><span class=\"proj\">{title}</span><span class=\"meta\">{live}updated <span id=\"updated\">{}</span> · read-only: approving is done with <code>loopflow approve</code></span></header>\n<main>\n<section class=\"summary\" id=\"summary\">{}</section>\n<section id=\"loops\">",
        stamp.0,
        stamp.1,
        escape(&short_time(&crate::state::now())),
        summary(&views)
    );
    for (_, card) in cards {
        o.push_str(card);
    }
    if views.is_empty() {
        o.push_str("<p class=\"empty\">No loops in this project yet: <code>loopflow create --loop NAME</code>.</p>");
    }
    let what = if mode == Mode::Live {
        "Live log"
    } else {
        "Recent log"
    };
    let _ = write!(
        o,
        "</section>\n<section class=\"log\"><h2>{what}</h2><ol id=\"log-lines\">"
    );
    for (name, line) in log {
        o.push_str(&log_line(name, line));
    }
    o.push_str("</ol></section>\n</main></body></html>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_replaces_markup_and_hidden_characters() {
        assert_eq!(escape("plain text\n\tok"), "plain text\n\tok");
        assert_eq!(
            escape("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(escape("caf\u{e9} \u{1F600}"), "caf\u{e9} \u{1F600}");
        assert_eq!(
            escape("a\u{202E}b\u{7}c\u{7F}d"),
            "a\u{FFFD}b\u{FFFD}c\u{FFFD}d"
        );
        assert_eq!(escape(""), "");
    }

    #[test]
    fn the_chart_is_svg_with_a_point_per_score_and_the_goal_line() {
        let pts: Vec<Point> = [(1, 0.2, false), (2, 0.6, false), (3, 1.0, true)]
            .iter()
            .map(|&(iteration, score, pass)| Point {
                iteration,
                score,
                pass,
            })
            .collect();
        let svg = chart(&pts, Some(1.0));
        assert!(svg.starts_with("<svg class=\"chart\""));
        assert_eq!(svg.matches("<circle").count(), 3);
        assert_eq!(svg.matches("class=\"pass\"").count(), 1);
        assert!(svg.contains("<line class=\"goal\""));
        assert!(svg.contains("<polyline class=\"line\" points=\"6.0,52.4 120.0,"));
        assert!(chart(&[], None).contains("no verdicts yet"));
    }

    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            escape("<script>a&b\"c'\u{1b}</script>"),
            "&lt;script&gt;a&amp;b&quot;c&#39;\u{FFFD}&lt;/script&gt;"
        );
        let li = log_line("l", "2026-11-30T02:10:00Z HALT <b> detail=\"x\"");
        assert!(li.contains("ev-HALT") && li.contains("&lt;b&gt;"), "{li}");
    }
}
