//! systemd: a `Type=oneshot` service plus a timer with `OnActiveSec`/`OnUnitActiveSec`
//! (any interval in seconds; a oneshot service still running is never started twice).
//! They are user units: without `loginctl enable-linger` they stop at logout.

use super::{File, Target};

/// systemd quoting for `ExecStart=`: `%` and `$` are specifiers/variables there.
pub(super) fn systemd_arg(a: &str) -> String {
    let a = a.replace('%', "%%").replace('$', "$$");
    if !a.is_empty()
        && !a
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\'' || c == '\\' || c == ';')
    {
        a
    } else {
        format!("\"{}\"", a.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

pub(super) fn systemd(t: &Target) -> Vec<File> {
    let label = t.label();
    let exec: Vec<String> = t.argv().iter().map(|a| systemd_arg(a)).collect();
    let service = format!(
        "[Unit]\n\
         Description=loopflow: one tick of loop {name} in {project}\n\
         \n\
         [Service]\n\
         # oneshot: a tick still running is never started twice.\n\
         Type=oneshot\n\
         WorkingDirectory={wd}\n\
         {env}\
         # An agent's key, when it has no login of its own: KEY=value lines, chmod 600.\n\
         EnvironmentFile=-%h/.config/loopflow/env\n\
         ExecStart={exec}\n\
         Nice=10\n",
        env = t
            .env
            .iter()
            .map(|(k, v)| format!(
                "Environment=\"{k}={}\"\n",
                v.replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('%', "%%")
            ))
            .collect::<String>(),
        name = t.loop_name,
        project = t.project.display().to_string().replace('%', "%%"),
        wd = t.project.display().to_string().replace('%', "%%"),
        exec = exec.join(" "),
    );
    let timer = format!(
        "[Unit]\n\
         Description=loopflow: tick loop {name} every {i} s\n\
         \n\
         # A user timer runs only while its user has a session: on a server, where nobody\n\
         # stays logged in, run `loginctl enable-linger $USER` once so it keeps firing.\n\
         [Timer]\n\
         OnActiveSec={i}s\n\
         OnUnitActiveSec={i}s\n\
         AccuracySec=1s\n\
         Unit={label}.service\n\
         \n\
         [Install]\n\
         WantedBy=timers.target\n",
        name = t.loop_name,
        i = t.interval,
    );
    vec![
        File {
            name: format!("{label}.service"),
            text: service,
        },
        File {
            name: format!("{label}.timer"),
            text: timer,
        },
    ]
}

/// Whether the user's manager outlives their sessions (`loginctl enable-linger`): systemd
/// marks a lingering user with a file named after them.
pub(super) fn lingering() -> bool {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_default();
    !user.is_empty()
        && std::path::Path::new("/var/lib/systemd/linger")
            .join(user)
            .exists()
}
