//! `[brakes]` (DESIGN §6): the iteration cap every loop must have, budgets, the score
//! plateau, the context floor, the phases the loop runs in.

use crate::diag::{Code, Diagnostic, Diagnostics, SourceRef};
use crate::toml_read::Table;

/// The hard context floor (D13): no loop runs an agent with less context than this.
pub(crate) const HARD_CONTEXT_FLOOR: u64 = 16_000;

#[derive(Debug, Clone)]
pub struct Brakes {
    pub max_iterations: u64,
    pub max_budget_usd: Option<f64>,
    pub max_tokens: Option<u64>,
    pub max_seconds: Option<f64>,
    pub score_plateau_window: usize,
    pub score_plateau_epsilon: f64,
    pub min_context_tokens: u64,
    pub context_tokens: Option<u64>,
    pub run_phases: Vec<String>,
    pub goal_score: f64,
    pub max_consecutive_aborts: u32,
}

/// The brakes, and whether they are valid. Invalid ones (no `[brakes]`, no usable
/// `max_iterations`) come back with a cap of 0, a placeholder that never runs: the
/// config is then incomplete, but its other checks still happen.
pub(super) fn read(
    root: &Table<'_, '_>,
    source: &SourceRef,
    diags: &mut Diagnostics,
) -> (Brakes, bool) {
    let Some(t) = root.table("brakes", diags) else {
        if root.get("brakes").is_none() {
            diags.push(
                Diagnostic::error(
                    Code::MissingKey,
                    source,
                    0..source.text.find('\n').unwrap_or(0),
                    "missing required key `brakes.max_iterations`",
                )
                .label("this loop has no `[brakes]` table")
                .help(
                    "add `[brakes]` with `max_iterations = 10`: every loop needs an iteration cap",
                ),
            );
        }
        return (Brakes::placeholder(), false);
    };
    t.deny_unknown(
        &[
            "max_iterations",
            "max_budget_usd",
            "max_tokens",
            "max_seconds",
            "score_plateau_window",
            "score_plateau_epsilon",
            "min_context_tokens",
            "context_tokens",
            "run_phases",
            "goal_score",
            "max_consecutive_aborts",
        ],
        diags,
    );
    let max_iterations = t.uint("max_iterations", diags);
    // A misspelt `max_iteration` is already reported as an unknown key that suggests it.
    let misspelt = || {
        t.table
            .iter()
            .any(|(k, _)| crate::diag::suggest(k.get_ref(), ["max_iterations"]).is_some())
    };
    if max_iterations.is_none() && t.get("max_iterations").is_none() && !misspelt() {
        t.missing("max_iterations", "max_iterations = 10", diags);
    }
    let positive = |key: &str, diags: &mut Diagnostics| -> Option<f64> {
        let (n, span) = t.number(key, diags)?;
        if n <= 0.0 {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    format!("`brakes.{key}` must be greater than zero"),
                )
                .label("not positive")
                .help(format!(
                    "remove `{key}` for no limit, or give a positive number"
                )),
            );
            return None;
        }
        Some(n)
    };
    let max_budget_usd = positive("max_budget_usd", diags);
    let max_seconds = positive("max_seconds", diags);
    let max_tokens = t.uint("max_tokens", diags).map(|x| x.0);
    let score_plateau_window = match t.uint("score_plateau_window", diags) {
        Some((0, span)) => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    "`brakes.score_plateau_window` must be at least 1",
                )
                .label("zero")
                .help("the number of recent scores compared for a plateau; the default is 3"),
            );
            3
        }
        Some((n, _)) => n as usize,
        None => 3,
    };
    let score_plateau_epsilon = match t.number("score_plateau_epsilon", diags) {
        Some((n, span)) if n < 0.0 => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    "`brakes.score_plateau_epsilon` cannot be negative",
                )
                .label("negative")
                .help("the largest score spread counted as flat; the default is 0.0"),
            );
            0.0
        }
        Some((n, _)) => n,
        None => 0.0,
    };
    let min_context_tokens = match t.uint("min_context_tokens", diags) {
        Some((n, span)) if n < HARD_CONTEXT_FLOOR => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    format!("`brakes.min_context_tokens` cannot be below the hard floor of {HARD_CONTEXT_FLOOR}"),
                )
                .label(format!("{n} < {HARD_CONTEXT_FLOOR}"))
                .help(format!("remove it (the default is {HARD_CONTEXT_FLOOR}) or raise it")),
            );
            HARD_CONTEXT_FLOOR
        }
        Some((n, _)) => n,
        None => HARD_CONTEXT_FLOOR,
    };
    let context_tokens = t.uint("context_tokens", diags).map(|x| x.0);
    let run_phases = t
        .str_list("run_phases", diags)
        .map(|(v, _)| v.into_iter().map(|s| s.value).collect())
        .unwrap_or_else(|| vec!["implement".to_string()]);
    let goal_score = match t.number("goal_score", diags) {
        Some((n, span)) if !(0.0..=1.0).contains(&n) => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    "`brakes.goal_score` must be between 0.0 and 1.0",
                )
                .label("out of range")
                .help("verdict scores run from 0.0 to 1.0; the default goal is 1.0"),
            );
            1.0
        }
        Some((n, _)) => n,
        None => 1.0,
    };
    let max_consecutive_aborts = match t.uint("max_consecutive_aborts", diags) {
        Some((0, span)) => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    "`brakes.max_consecutive_aborts` must be at least 1",
                )
                .label("zero")
                .help("the number of aborted ticks in a row that halts the loop; the default is 3"),
            );
            3
        }
        Some((n, _)) => n.min(u64::from(u32::MAX)) as u32,
        None => 3,
    };
    let b = Brakes {
        max_iterations: max_iterations.as_ref().map_or(0, |m| m.0),
        max_budget_usd,
        max_tokens,
        max_seconds,
        score_plateau_window,
        score_plateau_epsilon,
        min_context_tokens,
        context_tokens,
        run_phases,
        goal_score,
        max_consecutive_aborts,
    };
    (b, max_iterations.is_some())
}

/// A loop's budget limits as its ticks enforce them: `[brakes]`'s, plus what approvals
/// added (`approve --budget-usd +N`, …). A unit `[brakes]` gives no limit has none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BudgetLimits {
    pub usd: Option<f64>,
    pub tokens: Option<u64>,
    pub seconds: Option<f64>,
}

impl BudgetLimits {
    pub fn is_none(&self) -> bool {
        self.usd.is_none() && self.tokens.is_none() && self.seconds.is_none()
    }
}

impl Brakes {
    /// The budget limits with `extra` (the state's `extra_budget`) added.
    pub fn budget(&self, extra: &crate::state::Spent) -> BudgetLimits {
        BudgetLimits {
            usd: self.max_budget_usd.map(|l| l + extra.usd.max(0.0)),
            tokens: self.max_tokens.map(|l| l.saturating_add(extra.tokens)),
            seconds: self.max_seconds.map(|l| l + extra.seconds.max(0.0)),
        }
    }

    /// The defaults, with a cap of 0: stands in for brakes that did not read.
    fn placeholder() -> Brakes {
        Brakes {
            max_iterations: 0,
            max_budget_usd: None,
            max_tokens: None,
            max_seconds: None,
            score_plateau_window: 3,
            score_plateau_epsilon: 0.0,
            min_context_tokens: HARD_CONTEXT_FLOOR,
            context_tokens: None,
            run_phases: vec!["implement".to_string()],
            goal_score: 1.0,
            max_consecutive_aborts: 3,
        }
    }
}
