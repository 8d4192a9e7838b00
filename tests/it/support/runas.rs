//! Running the loopflow binary as an ordinary user. These machines run the tests as
//! root, and Landlock, ptrace and capabilities treat root differently, so the attack
//! tests run each attack twice: as root and as [`USER`] (`.ci/run` creates it), through
//! `setpriv`, with the project handed to that user.

use std::path::Path;
use std::process::Command;

/// The ordinary user the tests run loopflow as (`useradd -m loopflow-test`).
pub const USER: &str = "loopflow-test";

/// The `PATH` loopflow gets as the ordinary user: root's toolchains (`/root/.cargo`, …)
/// are not that user's to run.
pub const USER_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Who runs loopflow: the user the tests run as (`None`) or an ordinary one.
#[derive(Clone, Debug)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl std::fmt::Display for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.uid)
    }
}

/// The name of a runner, for messages: `root` or the user.
pub fn who(user: Option<&User>) -> String {
    user.map_or_else(
        || {
            // SAFETY: geteuid has no arguments and cannot fail.
            let uid = unsafe { libc::geteuid() };
            if uid == 0 {
                "root".into()
            } else {
                format!("uid {uid}")
            }
        },
        ToString::to_string,
    )
}

/// [`USER`] when the tests run as root (who can become it); `None` otherwise. When root
/// and the user is missing, a test fails under `LOOPFLOW_REQUIRE_SANDBOX` (CI) and says
/// how to create it, else skips the ordinary-user half.
pub fn ordinary() -> Option<User> {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |flag: &str| -> Option<u32> {
        let o = Command::new("id").args([flag, USER]).output().ok()?;
        String::from_utf8_lossy(&o.stdout).trim().parse().ok()
    };
    match (id("-u"), id("-g")) {
        (Some(uid), Some(gid)) => Some(User {
            name: USER.into(),
            uid,
            gid,
        }),
        _ => {
            assert!(
                std::env::var_os("LOOPFLOW_REQUIRE_SANDBOX").is_none(),
                "no user {USER} and LOOPFLOW_REQUIRE_SANDBOX is set (create it: useradd -m {USER})"
            );
            eprintln!("skipped as an ordinary user: no user {USER} (useradd -m {USER})");
            None
        }
    }
}

/// Everyone a test runs loopflow as: itself, and when that is root, the ordinary user.
pub fn runners() -> Vec<Option<User>> {
    let mut v = vec![None];
    if let Some(u) = ordinary() {
        v.push(Some(u));
    }
    v
}

impl User {
    /// Gives `path` and everything under it to this user.
    pub fn own(&self, path: &Path) {
        let ok = Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", self.uid, self.gid))
            .arg(path)
            .status();
        assert!(ok.is_ok_and(|s| s.success()), "chown {}", path.display());
    }

    /// Gives a project to this user: its directory and its machine state (where its
    /// loops' worktrees live).
    pub fn own_project(&self, p: &super::Project) {
        self.own(p.path());
        self.own(p.state_home.path());
    }

    /// `cmd` (program, arguments, directory, environment) run as this user instead:
    /// `setpriv --reuid --regid --init-groups`, which keeps the environment and the
    /// descriptors it is given.
    pub fn wrap(&self, cmd: &Command) -> Command {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--init-groups")
            .arg("--")
            .arg(cmd.get_program())
            .args(cmd.get_args());
        if let Some(d) = cmd.get_current_dir() {
            c.current_dir(d);
        }
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c.env("PATH", USER_PATH);
        c
    }
}

/// `cmd` as `user` when given, else as it is.
pub fn as_user(user: Option<&User>, cmd: Command) -> Command {
    match user {
        Some(u) => u.wrap(&cmd),
        None => cmd,
    }
}

/// `git ARGS` in `dir` whoever owns it (`safe.directory=*`: root reading the ordinary
/// user's repository); its stdout when it succeeds.
pub fn git_any(dir: &Path, args: &[&str]) -> Option<String> {
    let o = Command::new("git")
        .args(["-c", "safe.directory=*"])
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}
