//! Why a tick ended the way it did, as types. Each `Display` is the exact text that logs,
//! JSON and schedulers have always carried (`budget_exhausted:usd`, `when:implement`,
//! `exit:1`), so the strings are a rendering, never compared in code.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a loop halted: the five deaths (DESIGN §6), or a human's own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HaltReason {
    IterationsExhausted,
    BudgetExhausted(Budget),
    VerifierFailed(VerifierFailure),
    HumanIntervention(Intervention),
    GoalMet,
    /// A human accepted the loop's work and ended it (`loopflow close`): unlike every
    /// other halt, `approve` does not clear it.
    Closed,
    /// Any other text: what a human gave `loopflow halt --reason`, or a reason a newer
    /// loopflow wrote. Kept verbatim.
    Other(String),
}

/// The budget unit that ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    Usd,
    Tokens,
    Seconds,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifierFailure {
    Unparseable,
    ScorePlateau,
}

/// A halt that needs a person to look before the loop goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intervention {
    ContextBelowFloor,
    BlastRadius,
    HarnessFailing,
    StateTampered,
    ConfigChanged,
    NodeFailed,
    SandboxUnavailable,
    /// The tick's work could not be staged, checked or committed.
    CommitFailed,
    /// The repository's git configuration holds a credential a tick's processes could
    /// read (`[sandbox] mode = "enforce"` refuses to run agents beside it).
    CredentialExposed,
}

/// The five ways a run ends (the seed's audit table): every halt reason belongs to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Death {
    IterationsExhausted,
    BudgetExhausted,
    VerifierFailed,
    HumanIntervention,
    GoalMet,
}

impl Death {
    pub const ALL: [Death; 5] = [
        Death::IterationsExhausted,
        Death::BudgetExhausted,
        Death::VerifierFailed,
        Death::HumanIntervention,
        Death::GoalMet,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Death::IterationsExhausted => "iterations_exhausted",
            Death::BudgetExhausted => "budget_exhausted",
            Death::VerifierFailed => "verifier_failed",
            Death::HumanIntervention => "human_intervention",
            Death::GoalMet => "goal_met",
        }
    }
}

impl Budget {
    pub fn as_str(self) -> &'static str {
        match self {
            Budget::Usd => "usd",
            Budget::Tokens => "tokens",
            Budget::Seconds => "seconds",
        }
    }
}

impl VerifierFailure {
    fn as_str(self) -> &'static str {
        match self {
            VerifierFailure::Unparseable => "unparseable",
            VerifierFailure::ScorePlateau => "score_plateau",
        }
    }
}

impl Intervention {
    const ALL: [Intervention; 9] = [
        Intervention::ContextBelowFloor,
        Intervention::BlastRadius,
        Intervention::HarnessFailing,
        Intervention::StateTampered,
        Intervention::ConfigChanged,
        Intervention::NodeFailed,
        Intervention::SandboxUnavailable,
        Intervention::CommitFailed,
        Intervention::CredentialExposed,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Intervention::ContextBelowFloor => "context_below_floor",
            Intervention::BlastRadius => "blast_radius",
            Intervention::HarnessFailing => "harness_failing",
            Intervention::StateTampered => "state_tampered",
            Intervention::ConfigChanged => "config_changed",
            Intervention::NodeFailed => "node_failed",
            Intervention::SandboxUnavailable => "sandbox_unavailable",
            Intervention::CommitFailed => "commit_failed",
            Intervention::CredentialExposed => "credential_exposed",
        }
    }
}

impl HaltReason {
    /// Which of the five deaths this is. A human's own halt is a human intervention; a
    /// closed loop's work was accepted by a human, its goal met by their judgement.
    pub fn death(&self) -> Death {
        match self {
            HaltReason::IterationsExhausted => Death::IterationsExhausted,
            HaltReason::BudgetExhausted(_) => Death::BudgetExhausted,
            HaltReason::VerifierFailed(_) => Death::VerifierFailed,
            HaltReason::HumanIntervention(_) | HaltReason::Other(_) => Death::HumanIntervention,
            HaltReason::GoalMet | HaltReason::Closed => Death::GoalMet,
        }
    }
}

impl fmt::Display for HaltReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HaltReason::IterationsExhausted => f.write_str("iterations_exhausted"),
            HaltReason::BudgetExhausted(u) => write!(f, "budget_exhausted:{}", u.as_str()),
            HaltReason::VerifierFailed(v) => write!(f, "verifier_failed:{}", v.as_str()),
            HaltReason::HumanIntervention(i) => write!(f, "human_intervention:{}", i.as_str()),
            HaltReason::GoalMet => f.write_str("goal_met"),
            HaltReason::Closed => f.write_str("closed"),
            HaltReason::Other(s) => f.write_str(s),
        }
    }
}

impl FromStr for HaltReason {
    type Err = std::convert::Infallible;

    /// Never fails: text that is not a known reason is [`HaltReason::Other`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let known = match s.split_once(':') {
            None => match s {
                "iterations_exhausted" => Some(HaltReason::IterationsExhausted),
                "goal_met" => Some(HaltReason::GoalMet),
                "closed" => Some(HaltReason::Closed),
                _ => None,
            },
            Some(("budget_exhausted", u)) => [Budget::Usd, Budget::Tokens, Budget::Seconds]
                .into_iter()
                .find(|b| b.as_str() == u)
                .map(HaltReason::BudgetExhausted),
            Some(("verifier_failed", v)) => {
                [VerifierFailure::Unparseable, VerifierFailure::ScorePlateau]
                    .into_iter()
                    .find(|x| x.as_str() == v)
                    .map(HaltReason::VerifierFailed)
            }
            Some(("human_intervention", i)) => Intervention::ALL
                .into_iter()
                .find(|x| x.as_str() == i)
                .map(HaltReason::HumanIntervention),
            Some(_) => None,
        };
        Ok(known.unwrap_or_else(|| HaltReason::Other(s.to_string())))
    }
}

impl Serialize for HaltReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HaltReason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(s.parse().unwrap_or_else(|never| match never {}))
    }
}

impl From<Intervention> for HaltReason {
    fn from(i: Intervention) -> Self {
        HaltReason::HumanIntervention(i)
    }
}

/// Why a tick ended without running its nodes to the commit (nothing advanced).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// The loop is halted; a human must approve.
    Halted(HaltReason),
    NoCurrentTask,
    /// The task's phase is not one the loop runs in.
    Phase(String),
    WorktreeMissing,
    /// A `when` condition was false at this node, and that took in the commit.
    When(String),
    /// The walk ended without reaching a commit node.
    NoCommit,
    /// Another tick holds the loop's lock (or, for a remote loop, its lease).
    Locked,
    /// A remote loop's slot was already ticked by some runner (DESIGN §16).
    SlotTaken,
    /// The loop directory has no state file.
    Untracked,
    /// No such loop directory.
    UnknownLoop,
    DryRun,
    /// The agent's provider refused it for a usage or rate limit: no iteration used, and
    /// every loop with the same preset and credential skips until then (RFC 3339 UTC).
    UsageLimit {
        until: String,
    },
}

impl SkipReason {
    /// What the `SKIP` line says beside the reason (`until=…` for a usage limit).
    pub fn extra(&self) -> Option<(&'static str, &str)> {
        match self {
            SkipReason::UsageLimit { until } => Some(("until", until)),
            _ => None,
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::Halted(r) => write!(f, "halted:{r}"),
            SkipReason::NoCurrentTask => f.write_str("no_current_task"),
            SkipReason::Phase(p) => write!(f, "phase:{p}"),
            SkipReason::WorktreeMissing => f.write_str("worktree_missing"),
            SkipReason::When(n) => write!(f, "when:{n}"),
            SkipReason::NoCommit => f.write_str("no_commit"),
            SkipReason::Locked => f.write_str("locked"),
            SkipReason::SlotTaken => f.write_str("slot_taken"),
            SkipReason::Untracked => f.write_str("untracked"),
            SkipReason::UnknownLoop => f.write_str("unknown_loop"),
            SkipReason::DryRun => f.write_str("dry_run"),
            SkipReason::UsageLimit { .. } => f.write_str("usage_limit"),
        }
    }
}

/// Why a node failed (the `reason=` of an `ABORT` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    Exit(i32),
    Signal(i32),
    Timeout,
    /// No output for this long (`[harness] idle_timeout`); the text is the configured value.
    Idle(String),
    /// SIGINT/SIGTERM reached loopflow: says nothing about the node itself.
    Interrupted,
    /// The program could not be started.
    Spawn(String),
    /// An argv element or prompt did not render.
    Template(String),
    /// A `when` condition did not render.
    When(String),
    /// loopflow's own files could not be read or written.
    State(String),
    Io(String),
    BlastRadius(String),
    /// A git command failed; the text names the command.
    Git(String),
    /// The agent exited 0 but its own output says it failed (a preset's `error` pointer).
    Agent(String),
    /// The node's configuration had errors (never run: `check` reports them).
    InvalidConfig,
    Panic,
}

impl Failure {
    /// A failure of loopflow's own making that retrying the node cannot fix.
    pub fn is_interrupt(&self) -> bool {
        matches!(self, Failure::Interrupted)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Exit(c) => write!(f, "exit:{c}"),
            Failure::Signal(s) => write!(f, "signal:{s}"),
            Failure::Timeout => f.write_str("timeout"),
            Failure::Idle(d) => write!(f, "idle:{d}"),
            Failure::Interrupted => f.write_str("interrupted"),
            Failure::Spawn(e) => write!(f, "spawn:{e}"),
            Failure::Template(e) => write!(f, "template:{e}"),
            Failure::When(e) => write!(f, "when:{e}"),
            Failure::State(e) => write!(f, "state:{e}"),
            Failure::Io(e) => write!(f, "io:{e}"),
            Failure::BlastRadius(e) => write!(f, "blast_radius:{e}"),
            Failure::Git(e) => f.write_str(e),
            Failure::Agent(e) => {
                // One line, at most 200 characters: it goes into log lines and summaries.
                let line = e.lines().next().unwrap_or("");
                match line.char_indices().nth(200) {
                    Some((i, _)) => write!(f, "agent_error:{}…", &line[..i]),
                    None => write!(f, "agent_error:{line}"),
                }
            }
            Failure::InvalidConfig => f.write_str("invalid_config"),
            Failure::Panic => f.write_str("panic"),
        }
    }
}

/// How a node's run went, as the `--json` summary reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    Ok,
    Failed,
    /// Never ran: its `when` (or an upstream node's) was false.
    Skipped,
    NotRun,
    /// It ran and ended the tick as a skip (the gate found a reason not to tick).
    Skip,
    /// It ran and halted the loop (the gate's brakes, a blast-radius violation).
    Halt,
}

impl NodeStatus {
    /// Whether the node has run (successfully or not).
    pub fn settled(self) -> bool {
        matches!(
            self,
            NodeStatus::Ok | NodeStatus::Failed | NodeStatus::Skip | NodeStatus::Halt
        )
    }
}

impl fmt::Display for NodeStatus {
    /// The same word as the JSON summary's `status`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeStatus::Ok => "ok",
            NodeStatus::Failed => "failed",
            NodeStatus::Skipped => "skipped",
            NodeStatus::NotRun => "not_run",
            NodeStatus::Skip => "skip",
            NodeStatus::Halt => "halt",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halt_reasons_round_trip_through_their_text() {
        let all = [
            HaltReason::IterationsExhausted,
            HaltReason::BudgetExhausted(Budget::Usd),
            HaltReason::BudgetExhausted(Budget::Tokens),
            HaltReason::BudgetExhausted(Budget::Seconds),
            HaltReason::VerifierFailed(VerifierFailure::Unparseable),
            HaltReason::VerifierFailed(VerifierFailure::ScorePlateau),
            HaltReason::GoalMet,
            HaltReason::Closed,
            HaltReason::Other("lunch break".into()),
            HaltReason::Other("budget_exhausted:yen".into()),
        ]
        .into_iter()
        .chain(Intervention::ALL.map(HaltReason::HumanIntervention));
        for r in all {
            let text = r.to_string();
            assert_eq!(text.parse::<HaltReason>().ok(), Some(r.clone()), "{text}");
            let json = serde_json::to_string(&r).expect("json");
            assert_eq!(json, serde_json::to_string(&text).expect("json"));
        }
        assert_eq!(
            HaltReason::HumanIntervention(Intervention::BlastRadius).to_string(),
            "human_intervention:blast_radius"
        );
        assert_eq!(
            "lunch".parse::<HaltReason>().map(|r| r.death()).ok(),
            Some(Death::HumanIntervention)
        );
    }

    #[test]
    fn skip_and_failure_texts_are_the_log_format() {
        assert_eq!(
            SkipReason::Halted(HaltReason::GoalMet).to_string(),
            "halted:goal_met"
        );
        assert_eq!(
            SkipReason::When("implement".into()).to_string(),
            "when:implement"
        );
        assert_eq!(Failure::Exit(1).to_string(), "exit:1");
        assert_eq!(Failure::Idle("5m".into()).to_string(), "idle:5m");
        for st in [
            NodeStatus::Ok,
            NodeStatus::Failed,
            NodeStatus::Skipped,
            NodeStatus::NotRun,
            NodeStatus::Skip,
            NodeStatus::Halt,
        ] {
            let json = serde_json::to_string(&st).expect("json");
            assert_eq!(json, format!("\"{st}\""));
        }
        assert_eq!(NodeStatus::NotRun.to_string(), "not_run");
    }
}
