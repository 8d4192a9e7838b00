//! launchd: a LaunchAgent plist with `StartInterval`, which expresses any
//! `interval_seconds` exactly (a tick missed while the Mac sleeps is not made up).

use super::{File, Target};

pub(super) fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub(super) fn launchd(t: &Target) -> File {
    let label = t.label();
    let args: String = t
        .argv()
        .iter()
        .map(|a| format!("    <string>{}</string>\n", xml_escape(a)))
        .collect();
    let log = t.loop_dir.join(".schedule.log");
    let text = format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key>
  <string>{label}</string>
  <key>ProgramArguments</key>
  <array>
{args}  </array>
  <key>WorkingDirectory</key>
  <string>{wd}</string>
{env}  <key>StartInterval</key>
  <integer>{interval}</integer>
  <key>RunAtLoad</key>
  <false/>
  <key>ProcessType</key>
  <string>Background</string>
  <key>StandardOutPath</key>
  <string>{log}</string>
  <key>StandardErrorPath</key>
  <string>{log}</string>
</dict>
</plist>
"#,
        wd = xml_escape(&t.project.display().to_string()),
        env = if t.env.is_empty() {
            String::new()
        } else {
            let vars: String = t
                .env
                .iter()
                .map(|(k, v)| {
                    format!(
                        "    <key>{k}</key>\n    <string>{}</string>\n",
                        xml_escape(v)
                    )
                })
                .collect();
            format!("  <key>EnvironmentVariables</key>\n  <dict>\n{vars}  </dict>\n")
        },
        interval = t.interval,
        log = xml_escape(&log.display().to_string()),
    );
    File {
        name: format!("{label}.plist"),
        text,
    }
}
