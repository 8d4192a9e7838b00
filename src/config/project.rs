//! `.loopflow/config.toml`: defaults for every loop of a project. Today one table,
//! `[notify]` (DESIGN §13); a loop's own `[notify]` wins over it. Unknown keys are
//! errors here as in `loop.toml`.

use std::path::{Path, PathBuf};

use crate::diag::{Diagnostics, Source};
use crate::toml_read::{self, Table};

use super::Notify;

/// What `.loopflow/config.toml` sets.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProjectConfig {
    pub notify: Option<Notify>,
    pub telemetry: Option<super::telemetry::Telemetry>,
}

/// `<project>/.loopflow/config.toml`.
pub(crate) fn path(project: &Path) -> PathBuf {
    project.join(".loopflow").join("config.toml")
}

/// Whether `check` reads `p` as a project config: a project's `.loopflow/config.toml`,
/// or a `*.config.toml` file (the examples in `templates/notify/`, meant to be copied there).
pub(crate) fn is_project_config(p: &Path) -> bool {
    let Some(name) = p.file_name().and_then(|f| f.to_str()) else {
        return false;
    };
    name.ends_with(".config.toml")
        || (name == "config.toml"
            && p.parent()
                .and_then(Path::file_name)
                .is_some_and(|d| d == ".loopflow"))
}

impl ProjectConfig {
    /// Reads the file at `path`, pushing every problem into `diags`. `Ok(None)` when its
    /// TOML does not parse.
    pub(crate) fn read(
        path: &Path,
        base: &Path,
        diags: &mut Diagnostics,
    ) -> std::io::Result<Option<ProjectConfig>> {
        let text = crate::fs_safe::read_to_string(path)?;
        let source = Source::new(crate::diag::display_name(path, base), path, text);
        let Some(doc) = toml_read::parse(&source, diags) else {
            return Ok(None);
        };
        let root = Table::new(&source, doc.get_ref(), 0..0, "");
        root.deny_unknown(&["notify", "telemetry"], diags);
        let notify = super::notify::read(root.table("notify", diags), diags);
        let telemetry = super::telemetry::read(root.table("telemetry", diags), diags);
        Ok(Some(ProjectConfig { notify, telemetry }))
    }

    /// The project's defaults: none when the file does not exist; an error text (with
    /// the first problem) when it exists but does not read clean.
    pub(crate) fn load(project: &Path) -> Result<ProjectConfig, String> {
        let p = path(project);
        if !p.exists() {
            return Ok(ProjectConfig::default());
        }
        let mut diags = Diagnostics::default();
        match ProjectConfig::read(&p, project, &mut diags) {
            Err(e) => Err(format!("{}: {e}", p.display())),
            Ok(Some(c)) if !diags.has_errors() => Ok(c),
            Ok(_) => Err(format!(
                "{} has errors (run `loopflow check {}`)",
                p.display(),
                p.display()
            )),
        }
    }
}
