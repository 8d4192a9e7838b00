//! How an agent's key reaches a scheduled tick: cron, systemd and launchd start it with
//! an environment of their own, never the shell's exported variables. The CLI's own login
//! (its login file, read as the user) works everywhere; a key variable must be given to
//! the scheduler: systemd reads `~/.config/loopflow/env` (mode 600; `EnvironmentFile=`),
//! cron takes `KEY=value` lines in the crontab (readable only by its owner), launchd a
//! key the plist would carry in the clear — so there, the CLI's login.

use std::path::PathBuf;

use super::Platform;
use super::install::Record;

/// The file the systemd service reads its environment from: `$XDG_CONFIG_HOME/loopflow/env`
/// (else `~/.config/loopflow/env`). The unit names it `%h/.config/loopflow/env`, so only
/// the default location is read there.
pub(super) fn env_file() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".config/loopflow/env"))
}

/// The variable names a `KEY=value` text sets (comments and blank lines aside).
fn names(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("export ").unwrap_or(l).split_once('='))
        .map(|(k, _)| k.trim().to_string())
        .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .collect()
}

/// The variables an installed schedule gives its ticks (beyond `PATH`).
pub(crate) fn carried_env(rec: &Record) -> Vec<String> {
    match rec.platform {
        Platform::Systemd => env_file()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .map(|t| names(&t))
            .unwrap_or_default(),
        Platform::Cron => super::cron::crontab_read()
            .map(|t| names(&t))
            .unwrap_or_default(),
        Platform::Launchd => rec
            .files
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .flat_map(|t| {
                t.split("<key>")
                    .skip(1)
                    .filter_map(|k| k.split_once("</key>").map(|(k, _)| k.to_string()))
                    .collect::<Vec<_>>()
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Where a schedule on `p` takes its variables from, in words.
pub(crate) fn env_source(p: Platform) -> String {
    match p {
        Platform::Systemd => format!(
            "{} (the service's EnvironmentFile=)",
            env_file().map_or_else(
                || "~/.config/loopflow/env".into(),
                |f| f.display().to_string()
            )
        ),
        Platform::Cron => "a line of your crontab".into(),
        Platform::Launchd => "the launch agent's plist".into(),
        other => format!("the {} job's secrets", other.name()),
    }
}

/// How to give a scheduled tick on `p` one of `keys`, or use `program`'s own login.
pub(crate) fn key_fix(p: Platform, keys: &[String], program: &str) -> String {
    let key = keys.first().map_or("the key", String::as_str);
    let login = format!("or log in with `{program}` once (its own login works in every schedule)");
    match p {
        Platform::Systemd => format!(
            "put `{key}=…` in ~/.config/loopflow/env and `chmod 600` it (the service reads it: EnvironmentFile=), {login}"
        ),
        Platform::Cron => format!(
            "add a line `{key}=…` above loopflow's entry with `crontab -e` (your crontab is readable only by you), {login}"
        ),
        Platform::Launchd => format!(
            "log in with `{program}` once (its login is in your keychain or home; a key in the plist would be readable by others)"
        ),
        _ => format!("give the job {key} from its secrets, {login}"),
    }
}

/// What `schedule install` says about the key, for each agent the loop runs: where a
/// scheduled tick will take it from, or how to give it one.
pub(crate) fn how_keys_reach(p: Platform, agents: &[(String, Vec<String>, bool)]) -> Vec<String> {
    agents
        .iter()
        .map(|(program, keys, logged_in)| {
            if *logged_in {
                format!("key: {program} logs in from its own login file, which a scheduled tick reads as you")
            } else {
                format!(
                    "key: a scheduled tick does not see your shell's {}: {}",
                    keys.join(" or "),
                    key_fix(p, keys, program)
                )
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lines_name_their_variables() {
        let t = "# keys\nANTHROPIC_API_KEY=sk-x\nexport OPENAI_API_KEY=\"y\"\n\n*/5 * * * * /bin/true\nPATH=/usr/bin\n";
        assert_eq!(names(t), ["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "PATH"]);
    }
}
