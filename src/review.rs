//! `loopflow review`: what a loop did that a human has not yet seen, in git terms.
//!
//! "Since the last approval" means: from the commit the last approval recorded (the tip of
//! `loopflow/<name>` when the human approved, [`approved_head`]) to the branch's tip — but
//! never from before what is already landed: when the branch was merged after that
//! approval, or rewritten by `discard`, the range starts at the merge-base of the
//! checkout's HEAD and the branch instead. A loop never approved starts at that merge-base
//! too (where it branched off). A loop without a worktree commits on the checkout's own
//! branch: its range ends at HEAD, and the uncommitted changes in the checkout are shown.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::git::{GitError, Repo};
use crate::state::{Event, LoopPaths, State};

/// The most commits a review lists (the count is always exact).
const MAX_COMMITS: usize = 200;

/// What the loop's commits since the base change.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FileChange {
    /// `A`dded, `M`odified, `D`eleted, `R`enamed, … (git's letters).
    pub status: String,
    pub path: String,
    /// `None` for binary files.
    pub added: Option<u64>,
    pub deleted: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Commit {
    pub sha: String,
    pub author: String,
    pub at: String,
    pub subject: String,
}

/// Where the reviewed range starts, and why there.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Base {
    pub commit: String,
    /// `approval` (the head the last approval recorded), `merge-base` (where the branch
    /// left the checkout's HEAD) or `created` (the parent of the loop's first commit).
    pub kind: &'static str,
}

/// One tick's verdict since the base.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TickVerdict {
    pub at: String,
    pub iteration: Option<u64>,
    pub pass: Option<bool>,
    pub score: Option<f64>,
    pub reasons: Vec<String>,
    pub next_hint: Option<String>,
}

/// Everything `review` shows; `--json` prints it as one document.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Review {
    #[serde(rename = "loop")]
    pub name: String,
    pub project: String,
    /// `loopflow/<name>`, or `None` for a loop without a worktree.
    pub branch: Option<String>,
    pub worktree: Option<String>,
    /// The checkout's current branch (what `land` merges into).
    pub checkout_branch: Option<String>,
    pub base: Option<Base>,
    pub head: Option<String>,
    /// Commits in base..head (newest first, at most 200 listed).
    pub commits: Vec<Commit>,
    pub commit_count: usize,
    /// Commits `land` would merge (merge-base..tip), which may be more than reviewed.
    pub unlanded: Option<usize>,
    pub diffstat: String,
    pub files: Vec<FileChange>,
    /// Changed and untracked files not committed yet (`git status --porcelain`).
    pub uncommitted: Vec<String>,
    pub patch: Option<String>,
    pub verdicts: Vec<TickVerdict>,
    pub last_verdict: Option<crate::verdict::Verdict>,
    pub halt: Option<crate::state::Halt>,
    /// The last aborted tick, in the agent's own words (until a tick commits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_abort: Option<crate::state::AbortNote>,
    pub spent: crate::state::Spent,
    pub iteration_count: u64,
    pub last_approval: Option<crate::state::Approval>,
    /// What a human runs next, in order.
    pub next: Vec<String>,
    /// Why something could not be shown (not a git repository, no branch, …).
    pub notes: Vec<String>,
    /// Connections the sandbox refused (`<node>: <host>:<port>`), each once, from the
    /// log: what an agent tried to reach beyond its hosts (DESIGN §12).
    pub network_refused: Vec<String>,
}

/// The loop's branch name.
pub(crate) fn branch(name: &str) -> String {
    format!("loopflow/{name}")
}

/// The commit an approval made now records: the tip of the loop's branch, else (a loop
/// without a worktree) the checkout's HEAD. Best effort: `None` outside git.
pub(crate) fn approved_head(paths: &LoopPaths) -> Option<String> {
    let checkout = Repo::checkout(&paths.project).ok().flatten()?;
    let rev = |spec: &str| checkout.rev(spec).ok().flatten();
    rev(&format!("refs/heads/{}", branch(&paths.name))).or_else(|| rev("HEAD"))
}

/// `git status --porcelain` lines (untracked included when asked) of a repository's work
/// tree.
pub(crate) fn status_lines(repo: &Repo, untracked: bool) -> Result<Vec<String>, GitError> {
    Ok(repo.status(untracked)?.iter().map(|e| e.line()).collect())
}

fn commits(repo: &Repo, range: &str) -> Result<Vec<Commit>, GitError> {
    Ok(repo
        .log(&[], &[range], MAX_COMMITS)?
        .into_iter()
        .map(|c| Commit {
            sha: c.sha,
            author: c.author,
            at: c.at,
            subject: c.subject,
        })
        .collect())
}

/// Files changed between two commits, with line counts.
fn files(repo: &Repo, from: &str, to: &str) -> Result<Vec<FileChange>, GitError> {
    let status = repo.diff_text(&["--name-status", "-z"], from, Some(to))?;
    let mut out = Vec::new();
    let mut f = status.split('\0').filter(|x| !x.is_empty());
    while let Some(code) = f.next() {
        let renamed = code.starts_with('R') || code.starts_with('C');
        let mut path = f.next().map(str::to_string);
        if renamed {
            let to = f.next().map(str::to_string);
            path = match (path, to) {
                (Some(a), Some(b)) => Some(format!("{a} → {b}")),
                (a, b) => a.or(b),
            };
        }
        if let Some(path) = path {
            out.push(FileChange {
                status: code.chars().next().unwrap_or('?').to_string(),
                path,
                added: None,
                deleted: None,
            });
        }
    }
    let num = repo.diff_text(&["--numstat"], from, Some(to))?;
    for (line, fc) in num.lines().zip(out.iter_mut()) {
        let mut it = line.split('\t');
        fc.added = it.next().and_then(|n| n.parse().ok());
        fc.deleted = it.next().and_then(|n| n.parse().ok());
    }
    Ok(out)
}

/// The last verdicts from the log (at most `n`; after the last `APPROVE` line when
/// `since_approval`), with the reasons the verifier gave where its output is still in
/// `outputs/`, and the state's last verdict for the newest.
fn verdicts(paths: &LoopPaths, state: &State, since_approval: bool, n: usize) -> Vec<TickVerdict> {
    let bytes = crate::fs_safe::tail(&paths.log, 256 * 1024).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let mut out: Vec<TickVerdict> = Vec::new();
    for e in text.lines().filter_map(crate::state::log::parse_line) {
        if since_approval && e.event == Event::Approve.as_str() {
            out.clear();
            continue;
        }
        if e.event != Event::Tick.as_str() {
            continue;
        }
        let kv = |k: &str| e.args.get(k).map(String::as_str);
        let t = TickVerdict {
            at: e.at.clone(),
            iteration: kv("iter").and_then(|v| v.parse().ok()),
            pass: kv("pass").and_then(|v| v.parse().ok()),
            score: kv("score").and_then(|v| v.parse().ok()),
            reasons: Vec::new(),
            next_hint: None,
        };
        if t.pass.is_some() {
            out.push(t);
        }
    }
    let drop = out.len().saturating_sub(n);
    out.drain(..drop);
    let last = out.len().checked_sub(1);
    for (i, t) in out.iter_mut().enumerate() {
        let v = if Some(i) == last {
            state.last_verdict.clone()
        } else {
            t.iteration.and_then(|it| {
                let f = paths.outputs.join(format!("{it}-verify.stdout"));
                let tail = crate::fs_safe::tail(&f, crate::fs_safe::VERDICT_TAIL).ok()?;
                crate::verdict::parse(&String::from_utf8_lossy(&tail)).ok()
            })
        };
        if let Some(v) = v {
            t.reasons = v.reasons;
            t.next_hint = v.next_hint;
        }
    }
    out
}

/// Builds the review of one loop. Never fails: what git cannot tell goes into `notes`.
pub(crate) fn review(paths: &LoopPaths, state: &State, patch: bool) -> Result<Review, String> {
    // Another loop's state: what review would show is not this loop's work.
    paths.owns(state).map_err(|e| e.to_string())?;
    let dir = crate::worktree::configured_dir(paths);
    let copy = crate::worktree::checked(paths, dir.as_deref())?;
    let project = &paths.project;
    let last_approval = state.approvals.last().cloned();
    let mut r = Review {
        name: paths.name.clone(),
        project: project.display().to_string(),
        branch: None,
        worktree: None,
        checkout_branch: None,
        base: None,
        head: None,
        commits: Vec::new(),
        commit_count: 0,
        unlanded: None,
        diffstat: String::new(),
        files: Vec::new(),
        uncommitted: Vec::new(),
        patch: None,
        verdicts: verdicts(paths, state, last_approval.is_some(), 5),
        last_verdict: state.last_verdict.clone(),
        halt: state.halt.clone(),
        last_abort: state.last_abort.clone(),
        spent: state.spent.clone(),
        iteration_count: state.iteration_count,
        last_approval,
        next: Vec::new(),
        notes: Vec::new(),
        network_refused: network_refused(&paths.log),
    };
    if let Err(note) = fill_git(&mut r, paths, &copy, state, patch) {
        r.notes.push(note);
    }
    r.next = next_commands(&r, paths);
    Ok(r)
}

fn fill_git(
    r: &mut Review,
    paths: &LoopPaths,
    copy: &crate::worktree::Copy,
    state: &State,
    patch: bool,
) -> Result<(), String> {
    let project = &paths.project;
    let no_commit = || {
        format!(
            "{} is not a git repository with a commit: there are no commits or diffs to show",
            project.display()
        )
    };
    let checkout = Repo::checkout(project)
        .map_err(|e| e.to_string())?
        .ok_or_else(no_commit)?;
    let rev = |spec: &str| checkout.rev(spec).ok().flatten();
    if rev("HEAD").is_none() {
        return Err(no_commit());
    }
    // The loop's own repository, when it is there: checked (its `.git` put back if an
    // agent rewrote it, so the human's own git there works on it too) and its branch
    // caught up with the user's.
    let loop_repo = match copy.exists().then(|| copy.open()) {
        Some(Ok((repo, repaired))) => {
            if repaired {
                r.notes.push(format!(
                    "{}/.git named another repository (an agent rewrote it); it names the loop's own again",
                    copy.work_tree.display()
                ));
            }
            if let Err(why) = crate::worktree::sync(&checkout, &repo, &copy.branch) {
                r.notes.push(why);
            }
            Some(repo)
        }
        Some(Err(e)) => {
            r.notes
                .push(format!("the loop's worktree cannot be read: {e}"));
            None
        }
        None => None,
    };
    r.checkout_branch = checkout.current_branch();
    let br = branch(&paths.name);
    let approved = r.last_approval.as_ref().and_then(|a| a.head.clone());
    let (work, head, base): (Option<&Repo>, String, Option<Base>) = match rev(&format!(
        "refs/heads/{br}"
    )) {
        Some(tip) => {
            r.branch = Some(br.clone());
            r.worktree = loop_repo
                .as_ref()
                .map(|_| copy.work_tree.display().to_string());
            let mb = checkout.merge_base("HEAD", &tip);
            r.unlanded = mb
                .as_ref()
                .and_then(|m| checkout.count(&format!("{m}..{tip}")));
            let base = match (approved, mb) {
                (Some(a), Some(m))
                    if checkout.is_ancestor(&m, &a) && checkout.is_ancestor(&a, &tip) =>
                {
                    Some(Base {
                        commit: a,
                        kind: "approval",
                    })
                }
                (_, Some(m)) => Some(Base {
                    commit: m,
                    kind: "merge-base",
                }),
                _ => None,
            };
            (loop_repo.as_ref(), tip, base)
        }
        None => {
            // No branch of its own: the loop works (and commits) in the checkout.
            let head = rev("HEAD").unwrap_or_default();
            let base = match approved {
                Some(a) if checkout.is_ancestor(&a, &head) => Some(Base {
                    commit: a,
                    kind: "approval",
                }),
                _ => created_base(&checkout, state),
            };
            if base.is_none() {
                r.notes.push(
                        "no approval recorded a commit and no commit by loopflow since the loop was created: showing the checkout's uncommitted changes only".into(),
                    );
            }
            (Some(&checkout), head, base)
        }
    };
    if r.branch.is_some() && r.worktree.is_none() {
        r.notes.push(format!(
            "the worktree of {br} is missing; run `loopflow worktree restore --loop {}` to get it back",
            paths.name
        ));
    }
    let err = |e: GitError| e.to_string();
    if let Some(b) = &base {
        let range = format!("{}..{head}", b.commit);
        r.commit_count = checkout.count(&range).unwrap_or(0);
        r.commits = commits(&checkout, &range).map_err(err)?;
        r.files = files(&checkout, &b.commit, &head).map_err(err)?;
        r.diffstat = checkout
            .diff_text(&["--stat=100"], &b.commit, Some(&head))
            .map_err(err)?;
        if patch {
            r.patch = Some(
                checkout
                    .diff_text(&[], &b.commit, Some(&head))
                    .map_err(err)?,
            );
        }
    }
    if let Some(w) = work {
        r.uncommitted = status_lines(w, true).map_err(err)?;
        if patch && !r.uncommitted.is_empty() {
            let wip = w.diff_text(&[], "HEAD", None).map_err(err)?;
            r.patch.get_or_insert_with(String::new).push_str(&wip);
        }
    }
    r.head = Some(head);
    r.base = base;
    Ok(())
}

/// For a loop without a worktree and no approval: the parent of the first commit the
/// `git-commit` node made since the loop was created (its identity is loopflow's own).
fn created_base(checkout: &Repo, state: &State) -> Option<Base> {
    let since = format!("--since={}", state.created_at.as_deref()?);
    let log = checkout
        .log(&["--author=loopflow@localhost", &since], &["HEAD"], 10_000)
        .ok()?;
    let first = log.last()?.sha.clone();
    let parent = checkout.rev(&format!("{first}^")).ok().flatten()?;
    Some(Base {
        commit: parent,
        kind: "created",
    })
}

fn next_commands(r: &Review, paths: &LoopPaths) -> Vec<String> {
    let c = |verb: &str| crate::human::command(verb, &paths.name, &paths.project);
    let mut next = Vec::new();
    if r.patch.is_none() && (r.commit_count > 0 || !r.uncommitted.is_empty()) {
        next.push(format!("{} --patch", c("review")));
    }
    if r.halt.is_some() {
        next.push(format!("{} --note \"…\"", c("approve")));
    }
    if r.branch.is_some() && r.unlanded.unwrap_or(0) > 0 {
        next.push(c("land"));
        next.push(format!("{} --squash", c("land")));
        next.push(format!("{} --yes", c("discard")));
    }
    next
}

/// The review as text for a terminal; every agent-written value passes [`crate::out::printable`]
/// (one line each: an agent cannot forge a line, a control sequence or a bidi reordering).
pub(crate) fn render(r: &Review) -> String {
    use crate::human::{count, score, seconds, usd};
    use crate::out::printable;
    use std::fmt::Write as _;
    let mut o = String::new();
    let state = match &r.halt {
        Some(h) => format!(
            "HALTED {} at iteration {} ({}){}",
            printable(&h.reason.to_string()),
            h.iteration,
            h.at,
            h.detail
                .as_ref()
                .map(|d| format!(": {}", printable(d)))
                .unwrap_or_default()
        ),
        // Not `running`: in `status` that word means a tick is running now.
        None => format!("not halted, iteration {}", r.iteration_count),
    };
    let _ = writeln!(o, "loop {}: {state}", r.name);
    if let Some(a) = &r.last_abort {
        let _ = writeln!(
            o,
            "last abort {} ({} {}){}",
            printable(&a.at),
            printable(&a.node),
            printable(&a.reason),
            a.message
                .as_ref()
                .map(|m| format!(": {}", printable(&m.replace('\n', " | "))))
                .unwrap_or_default()
        );
        if !a.outputs.is_empty() {
            let files: Vec<String> = a
                .outputs
                .iter()
                .map(|f| printable(f).into_owned())
                .collect();
            let _ = writeln!(
                o,
                "         its output (in the loop's directory): {}",
                files.join(", ")
            );
        }
    }
    match (&r.branch, &r.checkout_branch) {
        (Some(b), into) => {
            let _ = writeln!(
                o,
                "branch   {b}{}",
                into.as_ref()
                    .map(|i| format!(" (lands into {i})"))
                    .unwrap_or_default()
            );
        }
        (None, Some(i)) => {
            let _ = writeln!(
                o,
                "branch   none: the loop works in the checkout on {i} and commits nothing (worktrees off)"
            );
        }
        (None, None) => {}
    }
    if let Some(w) = &r.worktree {
        let _ = writeln!(o, "worktree {w}");
    }
    if let Some(b) = &r.base {
        let short = &b.commit[..b.commit.len().min(10)];
        let why = match b.kind {
            "approval" => format!(
                "the last approval ({})",
                r.last_approval
                    .as_ref()
                    .map(|a| format!("{} at {}", printable(&a.by), a.at))
                    .unwrap_or_default()
            ),
            "created" => "the loop's first commit".into(),
            _ => "where the branch left the checkout's HEAD".into(),
        };
        let _ = writeln!(o, "since    {short}, {why}");
    }
    let _ = writeln!(o, "\ncommits  {}", r.commit_count);
    for c in &r.commits {
        let _ = writeln!(
            o,
            "  {} {}  ({}, {})",
            &c.sha[..c.sha.len().min(10)],
            printable(&c.subject),
            printable(&c.author),
            c.at
        );
    }
    if r.commit_count > r.commits.len() {
        let _ = writeln!(o, "  … and {} more", r.commit_count - r.commits.len());
    }
    if let Some(u) = r.unlanded.filter(|u| *u != r.commit_count) {
        let _ = writeln!(
            o,
            "  ({u} commit(s) in all are not on the checkout's branch yet)"
        );
    }
    if !r.files.is_empty() {
        let (a, d) = r.files.iter().fold((0, 0), |(a, d), f| {
            (a + f.added.unwrap_or(0), d + f.deleted.unwrap_or(0))
        });
        let _ = writeln!(o, "\nfiles    {} changed, +{a} -{d}", r.files.len());
        for f in &r.files {
            let n = match (f.added, f.deleted) {
                (Some(a), Some(d)) => format!("+{a} -{d}"),
                _ => "binary".into(),
            };
            let _ = writeln!(o, "  {}  {}  {n}", f.status, printable(&f.path));
        }
    }
    if !r.uncommitted.is_empty() {
        let _ = writeln!(o, "\nuncommitted ({})", r.uncommitted.len());
        for l in &r.uncommitted {
            let _ = writeln!(o, "  {}", printable(l));
        }
    }
    if !r.verdicts.is_empty() {
        let _ = writeln!(o, "\nverdicts");
        for v in &r.verdicts {
            let _ = writeln!(
                o,
                "  iter {:<4} {}  score {}  {}",
                v.iteration.map_or("?".into(), |i| i.to_string()),
                match v.pass {
                    Some(true) => "pass",
                    Some(false) => "fail",
                    None => "?   ",
                },
                v.score.map_or("-".into(), score),
                v.at
            );
            for reason in &v.reasons {
                let _ = writeln!(o, "      - {}", printable(reason));
            }
            if let Some(h) = &v.next_hint {
                let _ = writeln!(o, "      next: {}", printable(h));
            }
        }
    }
    let _ = writeln!(
        o,
        "\nspent    {} · {} tokens · {}",
        usd(r.spent.usd),
        count(r.spent.tokens),
        seconds(r.spent.seconds)
    );
    if !r.network_refused.is_empty() {
        let _ = writeln!(
            o,
            "\nnetwork refused (hosts not in the loop's or the agent's `hosts`)"
        );
        for n in &r.network_refused {
            let _ = writeln!(o, "  {}", printable(n));
        }
    }
    for n in &r.notes {
        let _ = writeln!(o, "note: {}", printable(n));
    }
    if !r.next.is_empty() {
        let _ = writeln!(o, "\nnext");
        for n in &r.next {
            let _ = writeln!(o, "  {n}");
        }
    }
    o
}

/// The review as JSON.
pub(crate) fn to_json(r: &Review) -> Value {
    serde_json::to_value(r).unwrap_or(Value::Null)
}

/// The log's `WARN node=<id> msg="network refused: <host>:<port>"` lines, as
/// `<id>: <host>:<port>`, each once, in the order first seen.
fn network_refused(log: &Path) -> Vec<String> {
    let text = crate::fs_safe::read_to_string(log).unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    for line in text.lines() {
        let Some((_, rest)) = line.split_once(" WARN node=") else {
            continue;
        };
        let Some((node, msg)) = rest.split_once(" msg=\"network refused: ") else {
            continue;
        };
        let what = format!("{node}: {}", msg.trim_end_matches('"'));
        if !out.contains(&what) {
            out.push(what);
        }
    }
    out
}
