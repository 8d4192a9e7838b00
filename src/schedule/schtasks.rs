//! Windows Task Scheduler XML, `MultipleInstancesPolicy=IgnoreNew`. The installed task
//! file is UTF-16LE with a byte-order mark and says `encoding="UTF-16"` (what Task
//! Scheduler writes and reads); `schedule print` writes UTF-8 text to stdout, so the
//! printed file says `encoding="UTF-8"`. Either one imports with `schtasks /Create /XML`.

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

/// The encoding a task file is written in, declared in its XML header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Encoding {
    Utf8,
    Utf16Le,
}

/// The task file `install` writes: UTF-16LE with a BOM, declaring UTF-16.
pub(super) fn task_file_bytes(t: &Target) -> (String, Vec<u8>) {
    let f = schtasks(t, Encoding::Utf16Le);
    let mut bytes = vec![0xFF, 0xFE];
    for u in f.text.encode_utf16() {
        bytes.extend_from_slice(&u.to_le_bytes());
    }
    (f.name, bytes)
}

pub(super) fn schtasks(t: &Target, encoding: Encoding) -> File {
    let argv = t.argv();
    let args: Vec<String> = argv[1..].iter().map(|a| win_arg(a)).collect();
    // Task Scheduler repeats at one-minute granularity at best.
    let interval = t.interval.max(60);
    let text = format!(
        r#"<?xml version="1.0" encoding="{encoding}"?>
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
        encoding = match encoding {
            Encoding::Utf8 => "UTF-8",
            Encoding::Utf16Le => "UTF-16",
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_installed_file_is_utf16le_with_a_bom_and_says_so() {
        let t = crate::schedule::tests::target();
        let (_, bytes) = task_file_bytes(&t);
        assert_eq!(&bytes[..2], &[0xFF, 0xFE]);
        let units: Vec<u16> = bytes[2..]
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let text = String::from_utf16(&units).expect("UTF-16");
        assert!(
            text.starts_with("<?xml version=\"1.0\" encoding=\"UTF-16\"?>"),
            "{text}"
        );
        let printed = schtasks(&t, Encoding::Utf8).text;
        assert!(printed.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"));
        assert_eq!(printed.replace("UTF-8", "UTF-16"), text);
    }
}
