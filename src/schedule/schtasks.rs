//! Windows Task Scheduler XML, `MultipleInstancesPolicy=IgnoreNew`.

use super::launchd::xml_escape;
use super::{File, Target};

/// Windows argument quoting (CommandLineToArgvW rules).
pub(super) fn win_arg(a: &str) -> String {
    if !a.is_empty() && !a.chars().any(|c| c == ' ' || c == '\t' || c == '"') {
        return a.to_string();
    }
    let mut out = String::from("\"");
    let mut backslashes = 0;
    for c in a.chars() {
        match c {
            '\\' => backslashes += 1,
            '"' => {
                out.push_str(&"\\".repeat(backslashes * 2 + 1));
                out.push('"');
                backslashes = 0;
            }
            _ => {
                out.push_str(&"\\".repeat(backslashes));
                out.push(c);
                backslashes = 0;
            }
        }
    }
    out.push_str(&"\\".repeat(backslashes * 2));
    out.push('"');
    out
}

pub fn schtasks(t: &Target) -> File {
    let argv = t.argv();
    let args: Vec<String> = argv[1..].iter().map(|a| win_arg(a)).collect();
    // Task Scheduler repeats at one-minute granularity at best.
    let interval = t.interval.max(60);
    let text = format!(
        r#"<?xml version="1.0" encoding="UTF-16"?>
<Task version="1.2" xmlns="http://schemas.microsoft.com/windows/2004/02/mit/task">
  <RegistrationInfo>
    <Description>loopflow: tick loop {name} in {project} every {interval} s</Description>
    <URI>\loopflow\{label}</URI>
  </RegistrationInfo>
  <Triggers>
    <TimeTrigger>
      <StartBoundary>2000-01-01T00:00:00</StartBoundary>
      <Enabled>true</Enabled>
      <Repetition>
        <Interval>PT{interval}S</Interval>
        <StopAtDurationEnd>false</StopAtDurationEnd>
      </Repetition>
    </TimeTrigger>
  </Triggers>
  <Settings>
    <MultipleInstancesPolicy>IgnoreNew</MultipleInstancesPolicy>
    <DisallowStartIfOnBatteries>false</DisallowStartIfOnBatteries>
    <StopIfGoingOnBatteries>false</StopIfGoingOnBatteries>
    <StartWhenAvailable>true</StartWhenAvailable>
    <ExecutionTimeLimit>PT0S</ExecutionTimeLimit>
    <Enabled>true</Enabled>
  </Settings>
  <Actions Context="Author">
    <Exec>
      <Command>{exe}</Command>
      <Arguments>{args}</Arguments>
      <WorkingDirectory>{project}</WorkingDirectory>
    </Exec>
  </Actions>
</Task>
"#,
        name = xml_escape(&t.loop_name),
        project = xml_escape(&t.project.display().to_string()),
        label = t.label(),
        exe = xml_escape(&argv[0]),
        args = xml_escape(&args.join(" ")),
    );
    File {
        name: format!("{}.xml", t.label()),
        text,
    }
}
