//! `daemon`: ticks loops on their intervals when no native scheduler is at hand. Each tick
//! runs as its own `loopflow run` process, so a tick outlives a killed daemon.
//!
//! The daemon sleeps in one `poll` until something needs it: a tick process ends (its
//! pidfd), SIGINT/SIGTERM arrive (a pipe the handler writes), the set of loops changes
//! (`--all`: inotify on `.loopflow/loops`), or the next loop is due (the timeout). It never
//! polls on a fixed period: an idle daemon wakes once per due tick. Where the kernel has
//! no pidfds or inotify (not Linux, or too old) it looks again every 50 ms while a tick
//! runs and every 5 s for new loops, as before.
//!
//! Bookkeeping, for L loops of which k are due at a wake: the schedule is a set ordered by
//! due time (O(log L) per tick scheduled, O(k log L) per wake), listing the loops is
//! O(L) and happens only when the directory changed, and a finished tick costs one read
//! of its loop.toml (for an edited interval).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Args;

use super::run::install_signals;
use crate::exit;
use crate::state::{Event, LogArg, LoopPaths};

#[derive(Args, Debug)]
pub(crate) struct DaemonArgs {
    /// Pipeline file; default: each loop's `pipeline` key, else the built-in tick.
    pub pipeline: Option<PathBuf>,
    /// The loop to tick.
    #[arg(
        long = "loop",
        value_name = "NAME",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    pub loop_name: Option<String>,
    /// Tick every loop of the project, each on its own interval.
    #[arg(long)]
    pub all: bool,
    /// Seconds between ticks; default: each loop's schedule.interval_seconds, else 3600.
    #[arg(long, value_name = "S")]
    pub interval: Option<u64>,
    /// Exit 0 after this many tick attempts (does not touch the loops' brakes); 0 means
    /// no limit, as when the flag is absent.
    #[arg(long, value_name = "N")]
    pub max_iterations: Option<u64>,
    /// Print each tick's JSON summary on stdout, one document per line (JSON Lines).
    #[arg(long)]
    pub json: bool,
    /// How many loops may tick at the same time (never two ticks of one loop).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub max_concurrent: usize,
}

/// How long a loop directory that appeared while the daemon runs, without a state file
/// yet, gets before its first tick.
const NEW_LOOP_GRACE: Duration = Duration::from_secs(1);

/// A tick process the daemon waits for.
struct Running {
    name: String,
    child: Child,
    /// Readable once the child has exited (Linux 5.3+); `None`: looked at on a timer.
    #[cfg(target_os = "linux")]
    pidfd: Option<std::os::fd::OwnedFd>,
    /// SIGTERM was passed on to it.
    passed_on: bool,
}

/// Starts one tick as a child `loopflow run` process. A tick of its own process means a
/// tick survives the daemon: when the daemon is killed (even with SIGKILL) the tick
/// finishes and commits, holding the loop's lock until then, instead of leaving its agent
/// running unlocked beside the next tick. SIGINT/SIGTERM to the daemon are passed on as
/// SIGTERM, which the tick handles as an interruption.
fn start_tick(exe: &Path, project: &Path, name: &str, a: &DaemonArgs) -> Result<Running, String> {
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--project").arg(project).arg("run");
    if let Some(p) = &a.pipeline {
        cmd.arg(p);
    }
    cmd.args(["--loop", name]);
    if a.json {
        cmd.arg("--json");
    }
    // On each loop's own schedule, a loop whose state lives in its repository is ticked
    // once per firing, however many machines run a daemon for it (a local loop ignores it).
    if a.interval.is_none() && std::env::var_os("LOOPFLOW_SLOT").is_none() {
        cmd.env("LOOPFLOW_SLOT", "auto");
    }
    cmd.stdin(std::process::Stdio::null());
    let child = cmd
        .spawn()
        .map_err(|e| format!("spawn loopflow run: {e}"))?;
    Ok(Running {
        name: name.to_string(),
        #[cfg(target_os = "linux")]
        pidfd: crate::process::pidfd_open(child.id()),
        child,
        passed_on: false,
    })
}

impl Running {
    /// Passes an interruption on, once.
    fn pass_on(&mut self) {
        if std::mem::replace(&mut self.passed_on, true) {
            return;
        }
        #[cfg(unix)]
        // SAFETY: kill only sends a signal to our own child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        #[cfg(not(unix))]
        let _ = self.child.kill();
    }
}

/// When each loop is due next, ordered by time (then name, as loops due together tick in
/// name order).
#[derive(Default)]
struct Schedule {
    queue: BTreeSet<(Instant, String)>,
    due: HashMap<String, Instant>,
}

impl Schedule {
    fn set(&mut self, name: &str, at: Instant) {
        if let Some(old) = self.due.insert(name.to_string(), at) {
            self.queue.remove(&(old, name.to_string()));
        }
        self.queue.insert((at, name.to_string()));
    }

    fn remove(&mut self, name: &str) {
        if let Some(old) = self.due.remove(name) {
            self.queue.remove(&(old, name.to_string()));
        }
    }

    /// The first loop due at `now`, taken off the schedule (it is ticking).
    fn pop_due(&mut self, now: Instant) -> Option<String> {
        let (at, _) = self.queue.first()?;
        if *at > now {
            return None;
        }
        let (_, name) = self.queue.pop_first()?;
        self.due.remove(&name);
        Some(name)
    }

    fn next(&self) -> Option<Instant> {
        self.queue.first().map(|(t, _)| *t)
    }
}

/// What woke the daemon.
#[derive(Default)]
struct Woken {
    /// The loops directory changed (or could not be watched: look again).
    loops_changed: bool,
}

/// The daemon's one place of waiting: a poll over the signal pipe, the loops directory's
/// inotify watch and the pidfds of running ticks.
struct Waiter {
    #[cfg(unix)]
    signals: Option<std::os::unix::net::UnixStream>,
    #[cfg(target_os = "linux")]
    watch: Option<DirWatch>,
}

impl Waiter {
    fn new(watch_dir: Option<&Path>) -> Waiter {
        #[cfg(unix)]
        let signals = std::os::unix::net::UnixStream::pair()
            .ok()
            .and_then(|(r, w)| {
                r.set_nonblocking(true).ok()?;
                for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                    signal_hook::low_level::pipe::register(sig, w.try_clone().ok()?).ok()?;
                }
                Some(r)
            });
        #[cfg(not(target_os = "linux"))]
        let _ = watch_dir;
        Waiter {
            #[cfg(unix)]
            signals,
            #[cfg(target_os = "linux")]
            watch: watch_dir.and_then(DirWatch::new),
        }
    }

    /// Whether a change of the loops directory wakes the wait (else it is looked at again
    /// every few seconds).
    fn watches(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            self.watch.is_some()
        }
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// Sleeps until a tick ends, a signal comes, the loops change, or `timeout` passes
    /// (`None`: no timeout).
    #[cfg(unix)]
    fn wait(&mut self, timeout: Option<Duration>, running: &[Running]) -> Woken {
        use std::os::fd::AsRawFd;
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(running.len() + 2);
        let pollfd = |fd: i32| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        if let Some(s) = &self.signals {
            fds.push(pollfd(s.as_raw_fd()));
        }
        #[cfg(target_os = "linux")]
        let watch_at = self.watch.as_ref().map(|w| {
            fds.push(pollfd(w.fd.as_raw_fd()));
            fds.len() - 1
        });
        let mut unwatched = false;
        for r in running {
            #[cfg(target_os = "linux")]
            match &r.pidfd {
                Some(fd) => fds.push(pollfd(fd.as_raw_fd())),
                None => unwatched = true,
            }
            #[cfg(not(target_os = "linux"))]
            {
                let _ = r;
                unwatched = true;
            }
        }
        // A child without a pidfd is looked at every 50 ms, as before pidfds; without the
        // signal pipe, the cancel flag every 100 ms.
        let timeout = match (timeout, self.signals.is_none()) {
            (None, true) => Some(Duration::from_millis(100)),
            (Some(t), true) => Some(t.min(Duration::from_millis(100))),
            (t, false) => t,
        };
        let timeout = match (timeout, unwatched) {
            (t, false) => t,
            (None, true) => Some(Duration::from_millis(50)),
            (Some(t), true) => Some(t.min(Duration::from_millis(50))),
        };
        let ms = timeout.map_or(-1, |t| {
            i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
        });
        // SAFETY: a valid array of pollfds and its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        let mut woken = Woken::default();
        if n <= 0 {
            return woken; // the timeout, or a signal that interrupted the poll itself
        }
        if let Some(s) = &self.signals {
            let mut buf = [0u8; 64];
            while std::io::Read::read(&mut &*s, &mut buf).is_ok_and(|n| n > 0) {}
        }
        #[cfg(target_os = "linux")]
        if let Some(i) = watch_at
            && fds[i].revents != 0
        {
            woken.loops_changed = true;
            if let Some(w) = &mut self.watch {
                w.drain();
            }
        }
        woken
    }

    #[cfg(not(unix))]
    fn wait(&mut self, timeout: Option<Duration>, _running: &[Running]) -> Woken {
        std::thread::sleep(
            timeout
                .unwrap_or(Duration::from_millis(50))
                .min(Duration::from_millis(50)),
        );
        Woken::default()
    }
}

/// An inotify watch on the loops directory, or (while it does not exist) on the nearest
/// existing directory above it, so a loop made or removed wakes the daemon.
#[cfg(target_os = "linux")]
struct DirWatch {
    fd: std::os::fd::OwnedFd,
    target: PathBuf,
    watching: Option<i32>,
}

#[cfg(target_os = "linux")]
impl DirWatch {
    fn new(target: &Path) -> Option<DirWatch> {
        use std::os::fd::FromRawFd;
        // SAFETY: inotify_init1 takes flags and returns a new fd or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the fd was just created for us.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mut w = DirWatch {
            fd,
            target: target.to_path_buf(),
            watching: None,
        };
        w.arm()?;
        Some(w)
    }

    /// Watches the target, or the nearest existing directory above it. Watching a
    /// directory already watched gives the same descriptor and no event; the old watch
    /// is removed only when the directory changed (its removal queues one `IN_IGNORED`,
    /// so re-arming on every wake would wake the daemon for ever).
    fn arm(&mut self) -> Option<()> {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let dir = self.target.ancestors().find(|d| d.is_dir())?;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        let mask = libc::IN_CREATE
            | libc::IN_DELETE
            | libc::IN_MOVED_FROM
            | libc::IN_MOVED_TO
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF
            | libc::IN_ONLYDIR;
        // SAFETY: a NUL-terminated path and our own inotify fd.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), mask) };
        if let Some(old) = self.watching.filter(|&old| old != wd) {
            // SAFETY: removes a watch of our own inotify fd (a stale one fails harmlessly).
            unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), old) };
        }
        self.watching = (wd >= 0).then_some(wd);
        self.watching.map(|_| ())
    }

    /// Reads the pending events (what changed is seen by listing the directory) and
    /// watches again where the directory now is.
    fn drain(&mut self) {
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads into our own buffer from our own non-blocking inotify fd.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
        }
        let _ = self.arm();
    }
}

/// `LOOPFLOW_DAEMON_STATS=1`: what the daemon did, on stderr when it stops (for the
/// benchmark of its own cost): ticks, wakes, and its own CPU time before the first tick,
/// until the last tick ended, and for the stop's log lines.
#[derive(Default)]
struct Stats {
    wakes: u64,
    startup_cpu: Option<Duration>,
}

/// This process's own CPU time (user + system), not its children's.
fn own_cpu() -> Duration {
    #[cfg(unix)]
    {
        // SAFETY: all-zero is a valid rusage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: getrusage fills the struct we pass.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        let tv = |t: libc::timeval| {
            Duration::new(t.tv_sec as u64, 0) + Duration::from_micros(t.tv_usec as u64)
        };
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }
    #[cfg(not(unix))]
    Duration::ZERO
}

pub(super) fn daemon(project: &Path, a: DaemonArgs) -> i32 {
    let cancel = install_signals();
    let names: Vec<String> = match &a.loop_name {
        Some(n) => {
            if let Err(code) = super::valid_name(project, n) {
                return code;
            }
            // Its ticks would each skip `unknown_loop` (a scheduler keeps firing): say
            // what was meant once, up front.
            if !crate::state::LoopPaths::new(project, n).dir.is_dir() {
                eprintln!("warning: {}", super::no_loop(project, n));
            }
            vec![n.clone()]
        }
        None => Vec::new(),
    };
    let max_concurrent = a.max_concurrent.max(1);
    // Taken once, while it surely exists: after an upgrade replaces the file, the path
    // names the new binary (Linux's /proc/self/exe would say "… (deleted)").
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: cannot find the path of the running loopflow binary: {e}");
            return exit::STATE;
        }
    };
    let loops_dir = crate::state::loops_dir(project);
    let mut waiter = Waiter::new(a.all.then_some(loops_dir.as_path()));
    let limit = a.max_iterations.filter(|&m| m > 0);
    let stats_on = std::env::var_os("LOOPFLOW_DAEMON_STATS").is_some();
    let mut stats = Stats::default();
    let mut attempts = 0u64;
    // Due times sit on a grid of each loop's interval measured from the daemon's start,
    // so loops sharing an interval wake together and nothing drifts; a slot missed while
    // a tick ran long is skipped, not made up in a burst.
    let start = Instant::now();
    let mut schedule = Schedule::default();
    // The last interval each loop's config gave: a config that does not read (being
    // edited, say) keeps it, and a loop never read yet retries after a minute.
    let mut known: HashMap<String, Duration> = HashMap::new();
    let mut interval_of = |name: &str| -> Duration {
        if let Some(s) = a.interval {
            return Duration::from_secs(s.max(1));
        }
        // Re-read every time: an edited interval applies from the next tick on.
        let paths = LoopPaths::new(project, name);
        let mut d = crate::diag::Diagnostics::default();
        match crate::config::LoopConfig::read(&paths.config(), project, &mut d) {
            Ok(Some(c)) => {
                let iv = Duration::from_secs(c.interval_seconds.max(1));
                known.insert(name.to_string(), iv);
                iv
            }
            _ => known.get(name).copied().unwrap_or(Duration::from_secs(60)),
        }
    };
    let next_slot = |iv: Duration, now: Instant| -> Instant {
        let k = now.saturating_duration_since(start).as_nanos() / iv.as_nanos().max(1) + 1;
        start + iv * u32::try_from(k).unwrap_or(u32::MAX)
    };
    let mut current: Vec<String> = Vec::new();
    let mut listed_at: Option<Instant> = None;
    // The loops of the first listing tick at once; those seen appearing later may settle.
    let mut listed_once = false;
    let mut running: Vec<Running> = Vec::new();
    loop {
        // The set of loops: listed again when the directory changed (or, unwatched, every
        // few seconds), so new loops are picked up and removed ones dropped.
        let stale = listed_at.is_none()
            || (!waiter.watches()
                && listed_at.is_some_and(|t| t.elapsed() >= Duration::from_secs(5)));
        if stale {
            let now_listed = if a.all {
                crate::state::list_loops(project)
            } else {
                names.clone()
            };
            let before: HashSet<&String> = current.iter().collect();
            let after: HashSet<&String> = now_listed.iter().collect();
            let now = Instant::now();
            let first_listing = !std::mem::replace(&mut listed_once, true);
            for n in now_listed.iter().filter(|n| !before.contains(n)) {
                if running.iter().any(|r| &r.name == n) {
                    continue;
                }
                // A loop seen appearing (inotify reports its directory at once) may still
                // be being created: without its state yet, it gets a second to finish, so
                // its first tick is not a `SKIP untracked` that defers it a whole minute.
                let settling = !first_listing && !LoopPaths::new(project, n).state.exists();
                schedule.set(n, if settling { now + NEW_LOOP_GRACE } else { now });
            }
            for n in current.iter().filter(|n| !after.contains(n)) {
                schedule.remove(n);
            }
            current = now_listed;
            listed_at = Some(Instant::now());
        }
        let cancelled = cancel.load(Ordering::SeqCst);
        let budget_left =
            |attempts: u64, running: usize| limit.is_none_or(|m| attempts + (running as u64) < m);
        // Start what is due, up to --max-concurrent and the --max-iterations budget.
        if !cancelled {
            let now = Instant::now();
            while running.len() < max_concurrent && budget_left(attempts, running.len()) {
                let Some(name) = schedule.pop_due(now) else {
                    break;
                };
                // A provider's usage limit (this loop's, or another's with the same
                // preset and credential): no tick until it lifts, and no wake before.
                if let Some((at, until)) = limit_until(project, &name) {
                    eprintln!(
                        "loopflow daemon: loop {name} waits for its agent's usage limit until {until}"
                    );
                    schedule.set(&name, at.max(next_slot(interval_of(&name), now)));
                    continue;
                }
                if stats_on && stats.startup_cpu.is_none() {
                    stats.startup_cpu = Some(own_cpu());
                }
                match start_tick(&exe, project, &name, &a) {
                    Ok(r) => running.push(r),
                    Err(e) => {
                        eprintln!("loopflow daemon: could not tick loop {name}: {e}; carrying on");
                        attempts += 1;
                        schedule.set(&name, next_slot(interval_of(&name), Instant::now()));
                    }
                }
            }
        } else {
            running.iter_mut().for_each(Running::pass_on);
        }
        let exhausted = !budget_left(attempts, 0);
        if running.is_empty() && (cancelled || exhausted) {
            let total = own_cpu();
            stopped(project, &current, attempts);
            if stats_on {
                eprintln!(
                    "{}",
                    serde_json::json!({
                        "loops": current.len(),
                        "ticks": attempts,
                        "wakes": stats.wakes,
                        "startup_cpu_ms": stats.startup_cpu.unwrap_or(total).as_secs_f64() * 1e3,
                        "cpu_ms": total.as_secs_f64() * 1e3,
                        // Logging DAEMON_STOPPED in every loop: O(L), once.
                        "stop_cpu_ms": own_cpu().saturating_sub(total).as_secs_f64() * 1e3,
                    })
                );
            }
            return exit::OK;
        }
        // Sleep until a tick ends, a signal, a change of the loops, or the next due time
        // (none to wait for while every slot is taken or nothing more may start).
        let timeout = if cancelled || exhausted || running.len() >= max_concurrent {
            None
        } else {
            let rescan = (!waiter.watches() && a.all).then(|| {
                listed_at.map_or(Duration::ZERO, |t| {
                    Duration::from_secs(5).saturating_sub(t.elapsed())
                })
            });
            let due = schedule
                .next()
                .map(|t| t.saturating_duration_since(Instant::now()));
            match (due, rescan) {
                (Some(d), Some(r)) => Some(d.min(r)),
                (d, r) => d.or(r),
            }
        };
        let woken = waiter.wait(timeout, &running);
        stats.wakes += 1;
        if woken.loops_changed {
            listed_at = None;
        }
        // Collect the ticks that ended; each is one attempt, and the loop is due again on
        // its interval's next slot.
        let mut i = 0;
        while i < running.len() {
            match running[i].child.try_wait() {
                Ok(None) => i += 1,
                done => {
                    let r = running.swap_remove(i);
                    match done {
                        Ok(Some(st)) if killed_by(&st).is_some() => {
                            // Killed outright, it could not stop its agents: what it left
                            // running goes now, not at the loop's next tick.
                            let sig = killed_by(&st).unwrap_or(0);
                            let cleaned = crate::tick::clean_up_after_killed_tick(project, &r.name);
                            eprintln!(
                                "loopflow daemon: the tick of loop {} was killed (signal {sig}); {}; carrying on",
                                r.name,
                                match cleaned {
                                    Ok(Some(0)) => "it left nothing running".to_string(),
                                    Ok(Some(n)) =>
                                        format!("stopped the {n} process(es) it left running"),
                                    Ok(None) =>
                                        "another tick holds the loop and cleans up".to_string(),
                                    Err(e) => format!("could not clean up after it: {e}"),
                                }
                            );
                        }
                        Ok(Some(st)) => {
                            let code = st.code().unwrap_or(exit::INTERRUPTED);
                            if code != exit::OK && code != exit::INTERRUPTED {
                                // One loop's failure never stops the others; `run` said why.
                                eprintln!(
                                    "loopflow daemon: the tick of loop {} exited with {code}; carrying on",
                                    r.name
                                );
                            }
                        }
                        Err(e) => eprintln!(
                            "loopflow daemon: could not tick loop {}: {e}; carrying on",
                            r.name
                        ),
                        Ok(None) => {}
                    }
                    attempts += 1;
                    if current.contains(&r.name) {
                        let now = Instant::now();
                        let mut at = next_slot(interval_of(&r.name), now);
                        if let Some((lifts, until)) = limit_until(project, &r.name) {
                            eprintln!(
                                "loopflow daemon: loop {} waits for its agent's usage limit until {until}",
                                r.name
                            );
                            at = at.max(lifts);
                        }
                        schedule.set(&r.name, at);
                    }
                }
            }
        }
    }
}

/// When a usage limit standing for one of the loop's agents lifts (as an instant of this
/// process's clock, and as recorded), if one stands.
fn limit_until(project: &Path, name: &str) -> Option<(Instant, String)> {
    let paths = LoopPaths::new(project, name);
    let mut d = crate::diag::Diagnostics::default();
    let cfg = crate::config::LoopConfig::read(&paths.config(), project, &mut d).ok()??;
    let r = crate::preset::limit::standing_any(&crate::brakes::limited_presets(&cfg))?;
    let left = r.until_ts()?.as_second() - jiff::Timestamp::now().as_second();
    let left = Duration::from_secs(u64::try_from(left.max(0)).unwrap_or(0));
    Some((Instant::now() + left, r.until))
}

/// The signal that ended a tick, when one did.
fn killed_by(st: &std::process::ExitStatus) -> Option<i32> {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        st.signal()
    }
    #[cfg(not(unix))]
    {
        let _ = st;
        None
    }
}

/// Logs `DAEMON_STOPPED` in each loop's log and says so.
fn stopped(project: &Path, names: &[String], attempts: u64) {
    for n in names {
        let p = LoopPaths::new(project, n);
        if p.dir.is_dir() {
            let _ = p.log(
                Event::DaemonStopped,
                &[LogArg::Kv("ticks", attempts.to_string())],
            );
        }
    }
    eprintln!("loopflow daemon stopped after {attempts} tick attempt(s)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_gives_due_loops_in_time_then_name_order() {
        let mut s = Schedule::default();
        let t0 = Instant::now();
        s.set("b", t0);
        s.set("a", t0);
        s.set("c", t0 + Duration::from_secs(5));
        s.set("b", t0 + Duration::from_secs(1)); // rescheduled: the old entry goes
        assert_eq!(s.pop_due(t0).as_deref(), Some("a"));
        assert_eq!(s.pop_due(t0), None);
        assert_eq!(s.next(), Some(t0 + Duration::from_secs(1)));
        s.remove("b");
        assert_eq!(s.next(), Some(t0 + Duration::from_secs(5)));
        assert_eq!(s.pop_due(t0 + Duration::from_secs(9)).as_deref(), Some("c"));
        assert!(s.queue.is_empty() && s.due.is_empty());
    }
}
