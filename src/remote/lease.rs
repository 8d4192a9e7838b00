//! A runner's lease on a remote loop (`lease.json` in the state ref, DESIGN §16): who holds
//! it, for which run and slot, until when, and the spend its tick has checkpointed so far.
//! A lease lasts the tick's longest possible run (its nodes' timeouts × tries) plus a
//! margin, so a live runner is never taken over; one found expired is a dead tick.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::load::Loaded;
use crate::state::Spent;

/// How long a tick may run when one of its spawning nodes has no timeout: GitHub's job
/// limit, the longest a hosted runner lives.
pub(super) const UNBOUNDED_TICK: Duration = Duration::from_secs(6 * 3600);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Lease {
    /// The machine (host name).
    pub holder: String,
    /// This run of `loopflow run`: unique, so its orphans ref is its own.
    pub run: String,
    pub slot: Option<String>,
    pub acquired_at: String,
    pub expires_at: String,
    /// What the tick's nodes spent so far (checkpointed after each spawning node).
    #[serde(default)]
    pub spent: Spent,
}

impl Lease {
    /// Whether the lease is over at `now` (an unreadable expiry counts as over: a lease
    /// nobody can read must not hold a loop forever).
    pub(crate) fn expired(&self, now: jiff::Timestamp) -> bool {
        match self.expires_at.parse::<jiff::Timestamp>() {
            Ok(until) => now >= until,
            Err(_) => true,
        }
    }

    pub(crate) fn new(
        run: &str,
        slot: Option<&str>,
        now: jiff::Timestamp,
        lasts: Duration,
    ) -> Lease {
        let until = jiff::SignedDuration::try_from(lasts)
            .ok()
            .and_then(|d| now.checked_add(d).ok())
            .unwrap_or(jiff::Timestamp::MAX);
        Lease {
            holder: holder(),
            run: run.to_string(),
            slot: slot.map(str::to_string),
            acquired_at: stamp(now),
            expires_at: stamp(until),
            spent: Spent::default(),
        }
    }
}

/// RFC 3339 UTC, seconds.
pub(super) fn stamp(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The longest one tick of `loaded` can take: every spawning node's timeout times its
/// tries, added up; `None` when such a node has no timeout.
pub(crate) fn tick_limit(loaded: &Loaded) -> Option<Duration> {
    let cfg = &loaded.config;
    let mut limit = Some(Duration::ZERO);
    for node in &loaded.pipeline.nodes {
        let tries = node.retries.saturating_add(1);
        let timeout = match node.spec.role() {
            Some(role) => node
                .timeout
                .or_else(|| cfg.roles.get(&role.value).and_then(|r| r.timeout))
                .or(cfg.harness_timeout),
            None if node.spec.spawns() => node.timeout,
            None => continue,
        };
        limit = match (limit, timeout) {
            (Some(sum), Some(t)) => sum.checked_add(t.saturating_mul(tries)),
            _ => None,
        };
    }
    limit
}

/// How long a lease taken now lasts: the tick's limit (or [`UNBOUNDED_TICK`]) plus the
/// margin.
pub(crate) fn duration(loaded: &Loaded, margin: Duration) -> Duration {
    tick_limit(loaded)
        .unwrap_or(UNBOUNDED_TICK)
        .saturating_add(margin)
}

/// This machine's name, as a lease names its holder (plain characters only).
pub(super) fn holder() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let h = plain(raw.trim());
    if h.is_empty() { "unknown".into() } else { h }
}

/// Characters a ref name and a log value take as they are.
fn plain(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(64)
        .collect::<String>()
        .trim_start_matches(['.', '-'])
        .to_string()
}

/// An id for this run, unique across runners: `LOOPFLOW_RUN_ID` when set, else GitHub's
/// run id and attempt (a re-run is a new attempt), else the host; then this process and
/// the time, so two runs never share one (or one orphans ref).
pub(super) fn run_id() -> String {
    let prefix = std::env::var("LOOPFLOW_RUN_ID")
        .ok()
        .map(|r| plain(&r))
        .filter(|r| !r.is_empty())
        .or_else(|| {
            let id = std::env::var("GITHUB_RUN_ID").ok()?;
            let attempt = std::env::var("GITHUB_RUN_ATTEMPT").unwrap_or_else(|_| "1".into());
            Some(plain(&format!("gh-{id}-{attempt}")))
        })
        .unwrap_or_else(holder);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}-{}-{nanos:08x}", std::process::id())
}

/// A slot as given (`--slot`, `LOOPFLOW_SLOT`), or `auto`: the firing time of the loop's
/// schedule nearest to now (`interval_seconds` from `offset`, as the generated
/// schedulers fire it), so every runner a scheduler starts for one firing names the same
/// slot even when it starts late or its clock is off by less than half an interval.
pub(super) fn resolve_slot(
    given: &str,
    interval: u64,
    offset: u64,
    now: jiff::Timestamp,
) -> String {
    if given != "auto" {
        return plain_slot(given);
    }
    let every = interval.max(60) as i64;
    let t = now.as_second() - offset as i64;
    let nearest = (t + every / 2).div_euclid(every) * every + offset as i64;
    jiff::Timestamp::from_second(nearest)
        .map(|t| t.strftime("%Y-%m-%dT%H:%MZ").to_string())
        .unwrap_or_else(|_| nearest.to_string())
}

/// A slot as the record keeps it: one line of plain text.
fn plain_slot(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control())
        .take(128)
        .collect::<String>()
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_lease_expires_after_its_time_and_an_unreadable_one_at_once() {
        let now = at("2026-12-07T10:00:00Z");
        let l = Lease::new("r", Some("s"), now, Duration::from_secs(600));
        assert_eq!(l.expires_at, "2026-12-07T10:10:00Z");
        assert!(!l.expired(now));
        assert!(!l.expired(at("2026-12-07T10:09:59Z")));
        assert!(l.expired(at("2026-12-07T10:10:00Z")));
        let bad = Lease {
            expires_at: "soon".into(),
            ..l
        };
        assert!(bad.expired(now));
    }

    #[test]
    fn auto_slots_name_the_nearest_firing() {
        // Hourly at minute 23: a run 20 minutes late, and one whose clock runs 10 minutes
        // early, both name 10:23.
        let s = |t| resolve_slot("auto", 3600, 23 * 60, at(t));
        assert_eq!(s("2026-12-07T10:43:00Z"), "2026-12-07T10:23Z");
        assert_eq!(s("2026-12-07T10:13:00Z"), "2026-12-07T10:23Z");
        assert_eq!(s("2026-12-07T11:00:00Z"), "2026-12-07T11:23Z");
        assert_eq!(
            resolve_slot("nightly\n1", 3600, 0, at("2026-12-07T10:00:00Z")),
            "nightly1"
        );
    }

    #[test]
    fn run_ids_are_plain_and_distinct() {
        let a = run_id();
        let b = run_id();
        assert!(
            a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)),
            "{a}"
        );
        assert!(a != b || a.is_empty());
    }
}
