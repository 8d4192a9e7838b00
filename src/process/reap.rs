//! What a node or a tick left running, found and stopped without trusting it. loopflow is
//! the subreaper of everything it starts, so every process a tick started stays in
//! loopflow's process tree whatever it does (`setsid`, double forks, a tracer of its own):
//! its own or an orphan that came back to loopflow. Each confined node's process leads a
//! session of its own (Linux), so whatever it started is in a session other than
//! loopflow's, which no process can join: that, not what a process says of itself, is
//! what tells its leftovers from loopflow's own helpers (`git`). A walk of the tree kills
//! each leftover the moment it is found, so a fork storm cannot outgrow it; every wait is
//! bounded.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{GRACE, tracked};

/// Makes this process the reaper of its orphaned descendants (Linux), so a process an
/// agent detached (`setsid`, a double fork) becomes loopflow's child instead of init's
/// and can be found and stopped. Best effort: elsewhere, escapes are only found by
/// their environment.
pub(crate) fn become_subreaper() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// A process's environment, as `KEY=VALUE` byte strings (Linux `/proc`).
#[cfg(target_os = "linux")]
fn environ(pid: i32) -> Vec<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

/// Whether this process has any child at all, running or exited, of any of its threads:
/// one `waitid` that reaps nothing, against reading `/proc` for every thread.
#[cfg(target_os = "linux")]
fn has_children() -> bool {
    // SAFETY: all-zero is a valid siginfo_t.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes only the siginfo we pass; WNOWAIT leaves every child as it is.
    let r = unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WSTOPPED | libc::WCONTINUED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // Only "no child processes" says there are none; anything else, look.
    !(r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD))
}

/// The direct children of `pid` (`None`: this process), every thread's, from `/proc`.
#[cfg(target_os = "linux")]
fn children_of(pid: Option<i32>) -> Vec<i32> {
    let dir = match pid {
        None => "/proc/self/task".to_string(),
        Some(p) => format!("/proc/{p}/task"),
    };
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(dir) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// A process's state, process group and session, from `/proc/<pid>/stat`
/// (`pid (comm) state ppid pgrp session …`; comm may hold spaces and parentheses). Reads
/// nothing of the process's memory, so no process can make it wait.
#[cfg(target_os = "linux")]
struct Stat {
    zombie: bool,
    pgrp: i32,
    session: i32,
}

#[cfg(target_os = "linux")]
fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().take(4).collect();
    Some(Stat {
        zombie: matches!(f.first(), Some(&"Z") | Some(&"X")),
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
    })
}

/// This process's session.
#[cfg(target_os = "linux")]
fn own_session() -> i32 {
    // SAFETY: getsid(0) asks about this process.
    unsafe { libc::getsid(0) }
}

/// Collects this process's children that exited and that no [`super::run`] waits for (a
/// killed group's members, reparented here): they are not leftovers.
pub(super) fn collect_zombies() {
    #[cfg(target_os = "linux")]
    {
        // Held while listing and collecting, so a child being spawned right now is either
        // tracked already or not yet a child.
        let tracked = tracked().lock().unwrap_or_else(|e| e.into_inner());
        for pid in children_of(None) {
            if !tracked.contains(&(pid as u32)) && stat(pid).is_some_and(|s| s.zombie) {
                // SAFETY: reaps a child of this very process that has exited.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
            }
        }
    }
}

/// Kills, over and over until none is left or `within` has passed, every process of this
/// process's tree (outside the subtrees of the children a `run` waits for) that `doomed`
/// picks; each is killed the moment it is found, before its children are looked at.
/// Returns how many it killed.
#[cfg(target_os = "linux")]
fn sweep(within: Duration, doomed: &dyn Fn(i32, &Stat, bool) -> bool) -> usize {
    let deadline = Instant::now() + within;
    let mut killed: HashSet<i32> = HashSet::new();
    // Nothing to look for (the common case) costs one waitid, not a /proc walk.
    if !has_children() {
        return 0;
    }
    while has_children() {
        collect_zombies();
        let skip: HashSet<u32> = tracked().lock().unwrap_or_else(|e| e.into_inner()).clone();
        let others = !skip.is_empty();
        let mut found = 0;
        let mut queue: std::collections::VecDeque<i32> = children_of(None).into();
        let mut seen = HashSet::new();
        while let Some(pid) = queue.pop_front() {
            if skip.contains(&(pid as u32)) || !seen.insert(pid) {
                continue;
            }
            let Some(s) = stat(pid) else { continue };
            if !s.zombie && doomed(pid, &s, others) {
                // SAFETY: kill only sends a signal to a process of this one's tree.
                if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                    killed.insert(pid);
                    found += 1;
                }
            }
            queue.extend(children_of(Some(pid)));
        }
        if found == 0 || Instant::now() >= deadline {
            break;
        }
        // Dying takes a moment; their children come back to this process meanwhile.
        std::thread::sleep(Duration::from_millis(2));
    }
    collect_zombies();
    killed.len()
}

/// Kills what is left of the session `sid` a node's process led: members that left its
/// process group (`setpgid`) but not its session.
pub(super) fn kill_session(sid: u32) {
    #[cfg(target_os = "linux")]
    {
        let sid = sid as i32;
        sweep(super::KILLED_WAIT, &|_, s, _| s.session == sid);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = sid;
}

/// The environment entries every process of one loop's ticks carries (the tick sets
/// them), by which leftovers of a killed tick are found.
pub(crate) fn loop_marks(loop_name: &str, project: &Path) -> [String; 2] {
    [
        format!("LOOPFLOW_LOOP={loop_name}"),
        format!("LOOPFLOW_PROJECT={}", project.display()),
    ]
}

/// Kills what nodes left running (Linux), of loopflow's tree but what a `run` waits for.
/// With `marks` empty (the tick's end: no node runs, no helper of loopflow's), all of it.
/// Else what a node left: a process in a session other than loopflow's (a confined
/// node's, which no process can join) when no other node's process runs; otherwise, and
/// for processes of loopflow's own session (unconfined nodes share it), only those whose
/// environment carries every one of `marks` (`LOOPFLOW_LOOP=…`, `LOOPFLOW_PROJECT=…`, and
/// for one node `LOOPFLOW_NODE=…`), so a sibling's processes and loopflow's own `git` are
/// left alone. Repeats until none is left, within the grace period. Returns how many were
/// killed.
pub(crate) fn reap_leftovers(marks: &[String]) -> usize {
    #[cfg(target_os = "linux")]
    {
        let mine = own_session();
        let marks: Vec<Vec<u8>> = marks.iter().map(|m| m.as_bytes().to_vec()).collect();
        sweep(GRACE, &|pid, s, others| {
            marks.is_empty() || (s.session != mine && !others) || {
                let env = environ(pid);
                marks.iter().all(|m| env.contains(m))
            }
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = marks;
        0
    }
}

/// Kills every process that carries this loop's `LOOPFLOW_LOOP` and `LOOPFLOW_PROJECT`
/// (Linux: read from `/proc`), whatever its group or session: what a tick killed outright
/// (`kill -9`, OOM) left running, found by the next tick. Matching the environment, not
/// a recorded group id, means a recycled id never takes an unrelated process down and a
/// process started before its group was recorded is still found. Returns how many were
/// killed; `seen` holds the pids killed by earlier calls (a process killed a moment ago
/// may not have exited yet) and gains this call's, so no process is counted twice.
pub(crate) fn kill_loop_processes(
    loop_name: &str,
    project: &Path,
    only_group: Option<u32>,
    seen: &mut HashSet<i32>,
) -> usize {
    #[cfg(target_os = "linux")]
    {
        let [want_loop, want_project] = loop_marks(loop_name, project).map(String::into_bytes);
        let me = std::process::id() as i32;
        let mut killed = 0;
        // Twice: a process caught half-way through exec the first time is seen the second.
        for _ in 0..2 {
            let Ok(rd) = std::fs::read_dir("/proc") else {
                return killed;
            };
            for e in rd.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                if pid == me
                    || seen.contains(&pid)
                    || only_group.is_some_and(|g| stat(pid).map(|s| s.pgrp as u32) != Some(g))
                {
                    continue;
                }
                let env = environ(pid);
                if env.contains(&want_loop) && env.contains(&want_project) {
                    // SAFETY: kill only sends a signal to a process identified above.
                    if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                        killed += 1;
                        seen.insert(pid);
                    }
                }
            }
        }
        killed
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (loop_name, project, only_group, seen);
        0
    }
}
