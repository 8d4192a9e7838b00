//! Many projects (DESIGN §15): the registry of a person's projects
//! (`$XDG_CONFIG_HOME/loopflow/projects.toml`, else `~/.config/loopflow/projects.toml`),
//! kept by `loopflow projects add|remove|list`, and the labels that name each project's
//! loops when `status`, `report` and `dashboard` show several (`api:fix-parser`).

use std::path::{Path, PathBuf};

/// Why the registry cannot be read or written; each message names the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegistryError {
    #[error(
        "neither XDG_CONFIG_HOME nor HOME is set: there is no ~/.config/loopflow/projects.toml to use"
    )]
    NoHome,
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{}: {message}(expected `projects = [\"~/src/api\", ...]`; `loopflow projects add DIR` writes it)",
        path.display()
    )]
    Invalid { path: PathBuf, message: String },
    #[error("{}: not UTF-8; projects.toml can only list UTF-8 paths", .0.display())]
    NotUtf8(PathBuf),
}

/// One project as a view over many shows it: `label` prefixes its loops' names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Source {
    pub label: String,
    pub dir: PathBuf,
}

#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    projects: Vec<String>,
}

/// Where the registry is: `$XDG_CONFIG_HOME/loopflow/projects.toml` (an absolute one, as
/// the XDG spec says to ignore a relative one), else `$HOME/.config/loopflow/projects.toml`.
pub(crate) fn registry_path() -> Result<PathBuf, RegistryError> {
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let base = match xdg {
        Some(x) => x,
        None => home().ok_or(RegistryError::NoHome)?.join(".config"),
    };
    Ok(base.join("loopflow").join("projects.toml"))
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// `~/x` with the home directory put in; anything else as written.
fn expand(entry: &str) -> PathBuf {
    match (entry.strip_prefix("~/"), home()) {
        (Some(rest), Some(h)) => h.join(rest),
        _ if entry == "~" => home().unwrap_or_else(|| PathBuf::from(entry)),
        _ => PathBuf::from(entry),
    }
}

/// The projects the registry at `path` lists, in its order (none when it does not exist).
pub(crate) fn load(path: &Path) -> Result<Vec<PathBuf>, RegistryError> {
    let text = match crate::fs_safe::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(RegistryError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let file: File = toml::from_str(&text).map_err(|e| RegistryError::Invalid {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(file.projects.iter().map(|p| expand(p)).collect())
}

/// Writes `dirs` as the registry at `path`, atomically (a temp file renamed over it, both
/// synced), creating its directory. A path under the home directory is written `~/...`,
/// so the file reads the same from a second machine.
pub(crate) fn save(path: &Path, dirs: &[PathBuf]) -> Result<(), RegistryError> {
    let io = |source| RegistryError::Io {
        path: path.to_path_buf(),
        source,
    };
    let h = home();
    let mut projects = Vec::with_capacity(dirs.len());
    for d in dirs {
        let shown = match h.as_deref().and_then(|h| d.strip_prefix(h).ok()) {
            Some(rest) if !rest.as_os_str().is_empty() => Path::new("~").join(rest),
            _ => d.clone(),
        };
        let s = shown
            .to_str()
            .ok_or_else(|| RegistryError::NotUtf8(d.clone()))?;
        projects.push(s.to_string());
    }
    let body = toml::to_string(&File { projects }).map_err(|e| RegistryError::Invalid {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let text = format!(
        "# The projects `loopflow status --all`, `report --all` and `dashboard --all` show.\n# Kept by `loopflow projects add|remove|list`; editing it by hand is fine.\n{body}"
    );
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    crate::fs_safe::write_atomic(dir, path, text.as_bytes()).map_err(io)
}

/// The absolute, canonical form of a project directory (as given when it does not exist).
pub(crate) fn canonical(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir)
        .or_else(|_| std::path::absolute(dir))
        .unwrap_or_else(|_| dir.to_path_buf())
}

/// Each directory with the shortest label that tells it apart from the others: its last
/// component, or as many of its last components as it takes (`work/api`, `home/api`).
/// Duplicates (the same directory twice) are dropped.
pub(crate) fn labelled(dirs: &[PathBuf]) -> Vec<Source> {
    let mut unique: Vec<PathBuf> = Vec::with_capacity(dirs.len());
    for d in dirs {
        if !unique.contains(d) {
            unique.push(d.clone());
        }
    }
    let tail = |d: &Path, n: usize| -> String {
        let parts: Vec<String> = d
            .components()
            .filter_map(|c| match c {
                std::path::Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        if parts.is_empty() {
            return d.display().to_string();
        }
        parts[parts.len().saturating_sub(n)..].join("/")
    };
    unique
        .iter()
        .map(|d| {
            let depth = d.components().count().max(1);
            let label = (1..=depth)
                .map(|n| tail(d, n))
                .find(|l| {
                    unique
                        .iter()
                        .filter(|o| *o != d)
                        .all(|o| (1..=depth).all(|n| tail(o, n) != *l))
                })
                .unwrap_or_else(|| d.display().to_string());
            Source {
                label,
                dir: d.clone(),
            }
        })
        .collect()
}

/// Why a project cannot be shown (gone, not a directory, its loops unreadable); `None`
/// when it can, loops or none.
pub(crate) fn problem(dir: &Path) -> Option<String> {
    match std::fs::metadata(dir) {
        Err(e) => return Some(format!("{}: {e}", dir.display())),
        Ok(m) if !m.is_dir() => return Some(format!("{}: not a directory", dir.display())),
        Ok(_) => {}
    }
    let loops = crate::state::loops_dir(dir);
    match std::fs::read_dir(&loops) {
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(format!("{}: {e}", loops.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(dirs: &[&str]) -> Vec<String> {
        let d: Vec<PathBuf> = dirs.iter().map(PathBuf::from).collect();
        labelled(&d).into_iter().map(|s| s.label).collect()
    }

    #[test]
    fn labels_are_the_shortest_tails_that_differ() {
        assert_eq!(labels(&["/src/api", "/src/web"]), ["api", "web"]);
        assert_eq!(
            labels(&["/home/a/api", "/work/api", "/x/web"]),
            ["a/api", "work/api", "web"]
        );
        assert_eq!(labels(&["/src/api", "/src/api"]), ["api"]);
        assert_eq!(labels(&["/"]), ["/"]);
    }

    #[test]
    fn the_registry_round_trips_and_names_its_file_when_broken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("loopflow/projects.toml");
        assert_eq!(load(&path).unwrap(), Vec::<PathBuf>::new());
        let dirs = vec![PathBuf::from("/srv/api"), PathBuf::from("/srv/web \"x\"")];
        save(&path, &dirs).unwrap();
        assert_eq!(load(&path).unwrap(), dirs);
        std::fs::write(&path, "projects = \"one\"\n").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.starts_with(&path.display().to_string()), "{e}");
        assert!(e.contains("line 1"), "{e}");
    }
}
