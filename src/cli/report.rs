//! `loopflow report --html FILE|-`: the dashboard's page written once (the same template,
//! without its live parts), for a human deciding whether to approve, or for CI artifacts.
//! Every loop the project has is on it, a broken one too; agent text is escaped.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::dashboard::{Mode, Model};
use crate::exit;

#[derive(Args, Debug)]
#[command(
    after_help = "A regular file is replaced atomically (mode 0644); a device, pipe or symlink (/dev/stdout) \
is written through; `-` prints to stdout.\n\nExamples:\n  loopflow report --html loops.html\n  loopflow report --html - > loops.html"
)]
pub(crate) struct ReportArgs {
    /// Where to write the page (`-`: stdout).
    #[arg(long, value_name = "FILE")]
    pub html: PathBuf,
    /// Every project in the registry (`loopflow projects`), loops named `project:loop`.
    #[arg(long)]
    pub all: bool,
}

/// Writes `bytes` to `path`: through it when it is not a regular file (a device such as
/// `/dev/stdout`, a FIFO, a symlink someone placed on purpose), else by atomic replace,
/// readable by everyone (pages are for people and web servers: 0644, not a temp file's
/// 0600).
fn write_page(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let through = std::fs::symlink_metadata(path)
        .is_ok_and(|m| m.file_type().is_symlink() || !m.file_type().is_file());
    if through {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)?;
        return f.write_all(bytes).and_then(|()| f.flush());
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    crate::fs_safe::write_atomic_as(dir, path, bytes, ".loopflow-report", true)
}

pub(super) fn report(project: &Path, a: ReportArgs) -> i32 {
    write_report(Model::once(project), a)
}

/// The report over many projects (`--all`, `--project` more than once).
pub(super) fn report_many(sources: &[crate::projects::Source], a: ReportArgs) -> i32 {
    write_report(Model::many(sources, false), a)
}

fn write_report(model: Model, a: ReportArgs) -> i32 {
    let page = model.page(Mode::Static);
    let loops = model.len();
    // The process exits next: freeing every loop's view, row and card one by one (a
    // few per cent of the command at 1,000 loops) gives nothing back.
    std::mem::forget(model);
    if a.html.as_os_str() == "-" {
        // A closed stdout (`| head`) ends the command quietly; a full disk does not.
        crate::out::write(page.as_bytes());
        return exit::OK;
    }
    match write_page(&a.html, page.as_bytes()) {
        Ok(()) => {
            eprintln!("wrote {} ({loops} loop(s))", a.html.display());
            exit::OK
        }
        Err(e) => {
            eprintln!("error: cannot write {}: {e}", a.html.display());
            exit::STATE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_replaces_a_file_atomically_and_is_world_readable() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.html");
        write_page(&p, b"one").unwrap();
        write_page(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o644);
        }
    }
}
