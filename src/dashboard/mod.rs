//! The dashboard and the static report: every loop of a project on one page (DESIGN §13).
//! [`Model`] holds what the page shows and keeps it current cheaply: a full refresh
//! `stat`s each loop's files and rebuilds only the loops whose files changed (reading only
//! the new end of their logs); [`Model::apply`] rebuilds just the loops a file-system
//! watcher (`watcher`) names. `page` renders it, `server` serves it live on loopback with
//! server-sent events; `report --html` writes the same page once.

use crate::row::Row;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

mod data;
mod page;
mod server;
mod watcher;

use data::{Fingerprint, LoopView};
pub(crate) use page::Mode;
pub(crate) use server::Server;

/// Log lines the page's tail keeps (across loops), and how many a loop adds at start.
const LOG_KEEP: usize = 200;
const LOG_SHOW: usize = 60;

struct Entry {
    /// The project it belongs to (an index into the model's sources).
    src: usize,
    fp: Fingerprint,
    view: LoopView,
    /// The loop's rendered card.
    html: String,
    /// The model version at which this loop last changed.
    version: u64,
}

/// A project the model reads: labelled when there are many (its loops named
/// `label:loop`), not when there is one (the page as it always was).
struct Src {
    label: Option<String>,
    dir: PathBuf,
}

/// Every loop's view, and the projects' recent log lines.
pub(crate) struct Model {
    sources: Vec<Src>,
    /// Whether [`Model::refresh`] will be called again: only then does each loop's
    /// [`Fingerprint`] (a `stat` of four files) earn its cost.
    watch: bool,
    entries: BTreeMap<String, Entry>,
    version: u64,
    /// (sequence number, loop, line), oldest first.
    log: VecDeque<(u64, String, String)>,
    seq: u64,
}

/// What changed on disk, as the watcher saw it: the projects whose list of loops may have
/// changed, and the loops whose files did, by project (an index into the model's sources).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Changes {
    pub relist: BTreeSet<usize>,
    pub loops: BTreeSet<(usize, String)>,
}

/// A loop's key in the model, its project's index and the loop's name, or why a project of
/// many cannot be read.
type Listed = (String, usize, Result<String, String>);

impl Model {
    /// A model of `project`, kept current by [`Model::refresh`] (the dashboard).
    pub(crate) fn new(project: &Path) -> Model {
        Model::read(Model::one(project), true)
    }

    /// A model of `project` read once and never refreshed (`report`).
    pub(crate) fn once(project: &Path) -> Model {
        Model::read(Model::one(project), false)
    }

    /// A model of many projects (DESIGN §15), live (`watch`) or read once.
    pub(crate) fn many(sources: &[crate::projects::Source], watch: bool) -> Model {
        let srcs = sources
            .iter()
            .map(|s| Src {
                label: Some(s.label.clone()),
                dir: s.dir.clone(),
            })
            .collect();
        Model::read(srcs, watch)
    }

    fn one(project: &Path) -> Vec<Src> {
        vec![Src {
            label: None,
            // Absolute, so the commands the page shows work from any directory.
            dir: std::fs::canonicalize(project).unwrap_or_else(|_| project.to_path_buf()),
        }]
    }

    fn read(sources: Vec<Src>, watch: bool) -> Model {
        let mut m = Model {
            sources,
            watch,
            entries: BTreeMap::new(),
            version: 0,
            log: VecDeque::new(),
            seq: 0,
        };
        m.refresh();
        m
    }

    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// The projects' directories, in the order [`Changes`] numbers them.
    pub(crate) fn dirs(&self) -> Vec<PathBuf> {
        self.sources.iter().map(|s| s.dir.clone()).collect()
    }

    /// Re-reads the loops whose files changed since the last refresh (a `stat` of each
    /// loop's files); returns whether anything did. Loops that appeared are added, loops
    /// that went away removed.
    pub(crate) fn refresh(&mut self) -> bool {
        let all: BTreeSet<usize> = (0..self.sources.len()).collect();
        self.update(&all, true, &BTreeSet::new())
    }

    /// [`Model::refresh`] of the projects `sources` only (those the kernel cannot watch).
    pub(crate) fn refresh_sources(&mut self, sources: &BTreeSet<usize>) -> bool {
        self.update(sources, true, &BTreeSet::new())
    }

    /// Takes in what a watcher saw: relists the projects named (adding and removing
    /// loops, without a `stat` of the others) and rebuilds the loops named. Returns
    /// whether anything changed.
    pub(crate) fn apply(&mut self, c: &Changes) -> bool {
        self.update(&c.relist, false, &c.loops)
    }

    /// The loops of project `i` as keys of the model: over many projects `label:loop`,
    /// or `label:` with why the project cannot be read.
    fn listing(&self, i: usize) -> Vec<Listed> {
        let src = &self.sources[i];
        let Some(label) = &src.label else {
            let names = crate::state::list_loops(&src.dir);
            return names.into_iter().map(|n| (n.clone(), i, Ok(n))).collect();
        };
        match crate::projects::problem(&src.dir) {
            Some(why) => vec![(format!("{label}:"), i, Err(why))],
            None => crate::state::list_loops(&src.dir)
                .into_iter()
                .map(|n| (format!("{label}:{n}"), i, Ok(n)))
                .collect(),
        }
    }

    fn key(&self, i: usize, name: &str) -> String {
        match &self.sources[i].label {
            Some(label) => format!("{label}:{name}"),
            None => name.to_string(),
        }
    }

    /// Relists the projects `relist` (with `stat`, rebuilding those of their loops whose
    /// files changed) and rebuilds the loops `dirty` that the model has.
    fn update(
        &mut self,
        relist: &BTreeSet<usize>,
        stat: bool,
        dirty: &BTreeSet<(usize, String)>,
    ) -> bool {
        let mut listed: Vec<Listed> = relist.iter().flat_map(|&i| self.listing(i)).collect();
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        let before = self.entries.len();
        self.entries.retain(|k, e| {
            !relist.contains(&e.src) || listed.binary_search_by(|l| l.0.as_str().cmp(k)).is_ok()
        });
        let mut changed = self.entries.len() != before;
        // The changed loops of projects not relisted, when the model has them (a loop the
        // model does not have yet comes with its project's relisting).
        for (i, name) in dirty.iter().filter(|(i, _)| !relist.contains(i)) {
            let key = self.key(*i, name);
            if self.entries.contains_key(&key) {
                listed.push((key, *i, Ok(name.clone())));
            }
        }
        let mut new_lines: Vec<(String, String)> = Vec::new();
        for (key, i, name) in &listed {
            let src = &self.sources[*i];
            let name = match name {
                Ok(n) => n,
                Err(why) => {
                    if self
                        .entries
                        .get(key)
                        .is_some_and(|e| e.view.broken.as_ref() == Some(why))
                    {
                        continue;
                    }
                    let label = src.label.as_deref().unwrap_or_default();
                    let view = data::LoopView::broken_project(label, &src.dir, why.clone());
                    self.put(key, *i, Fingerprint::default(), view);
                    changed = true;
                    continue;
                }
            };
            let known = self.entries.get(key);
            // Told it changed: rebuilt. Known and not told: rebuilt when a `stat` says
            // so, or left alone when there is no `stat` (the watcher would have told).
            let told = !dirty.is_empty() && dirty.contains(&(*i, name.clone()));
            if known.is_some() && !told && !stat {
                continue;
            }
            let fp = if self.watch {
                Fingerprint::of(&src.dir, name)
            } else {
                Fingerprint::default()
            };
            if !told && known.is_some_and(|e| e.fp == fp) {
                continue;
            }
            let prev = self.entries.remove(key).map(|e| e.view);
            let (mut view, fresh) = data::view(&src.dir, name, prev);
            if let Some(label) = &src.label {
                view = view.in_project(label);
            }
            new_lines.extend(fresh.into_iter().map(|l| (key.clone(), l)));
            changed = true;
            self.put(key, *i, fp, view);
        }
        // Lines from different loops, in time order (the timestamp leads each line).
        new_lines.sort_by(|a, b| a.1.split(' ').next().cmp(&b.1.split(' ').next()));
        for (name, line) in new_lines {
            self.seq += 1;
            self.log.push_back((self.seq, name, line));
            if self.log.len() > LOG_KEEP {
                self.log.pop_front();
            }
        }
        if changed {
            self.version += 1;
        }
        changed
    }

    /// Adds or replaces the entry `key`, its card rendered now.
    fn put(&mut self, key: &str, src: usize, fp: Fingerprint, view: data::LoopView) {
        self.version += 1;
        let html = page::article(&view);
        self.entries.insert(
            key.to_string(),
            Entry {
                src,
                fp,
                view,
                html,
                version: self.version,
            },
        );
    }

    /// What the page's title names: the project's directory, or the projects' labels.
    fn title(&self) -> String {
        match &self.sources[..] {
            [one] if one.label.is_none() => one.dir.display().to_string(),
            many => {
                let labels: Vec<&str> = many.iter().filter_map(|s| s.label.as_deref()).collect();
                format!("{} projects: {}", labels.len(), labels.join(", "))
            }
        }
    }

    fn is_many(&self) -> bool {
        self.sources.iter().any(|s| s.label.is_some())
    }

    /// The loops in page order: halted first (they wait for a human), then broken, running,
    /// ready; by name within each.
    fn ordered(&self) -> Vec<&Entry> {
        let mut v: Vec<&Entry> = self.entries.values().collect();
        v.sort_by(|a, b| (a.view.standing(), &a.view.name).cmp(&(b.view.standing(), &b.view.name)));
        v
    }

    /// Each loop's view with its card, rendered once when its files changed.
    fn cards(&self) -> Vec<(&LoopView, &str)> {
        self.ordered()
            .into_iter()
            .map(|e| (&e.view, e.html.as_str()))
            .collect()
    }

    /// The newest log lines for the page's tail.
    fn log_tail(&self) -> Vec<(String, String)> {
        self.log
            .iter()
            .rev()
            .take(LOG_SHOW)
            .rev()
            .map(|(_, n, l)| (n.clone(), l.clone()))
            .collect()
    }

    /// The page: live (with its script) or static.
    pub(crate) fn page(&self, mode: Mode) -> String {
        page::page(
            &self.title(),
            &self.cards(),
            &self.log_tail(),
            mode,
            (self.version, self.seq),
        )
    }

    /// How many loops the page shows.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Exactly `status --json`'s document: the rows of the loops whose state loads, by name
    /// (over many projects, halted first, with the projects, as `status --all` prints it).
    pub(crate) fn status(&self) -> Value {
        let mut rows: Vec<&Row> = self
            .entries
            .values()
            .filter_map(|e| e.view.row.as_ref())
            .collect();
        let errors: Vec<Value> = self
            .entries
            .iter()
            .filter_map(|(name, e)| {
                let v = &e.view;
                if v.project_broken {
                    return Some(json!({
                        "project": v.project, "project_dir": v.dir, "error": v.broken
                    }));
                }
                let err = v.row_error.as_ref()?;
                Some(match &v.project {
                    Some(p) => {
                        json!({ "name": name, "project": p, "project_dir": v.dir, "error": err })
                    }
                    None => json!({ "name": name, "error": err }),
                })
            })
            .collect();
        let unstarted: Vec<&String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.view.unstarted)
            .map(|(name, _)| name)
            .collect();
        if !self.is_many() {
            return json!({ "loops": rows, "errors": errors, "unstarted": unstarted });
        }
        rows.sort_by(|x, y| (x.halt.is_none(), &x.name).cmp(&(y.halt.is_none(), &y.name)));
        let projects: Vec<Value> = self
            .sources
            .iter()
            .map(|s| json!({ "label": s.label, "dir": s.dir }))
            .collect();
        json!({ "projects": projects, "loops": rows, "errors": errors, "unstarted": unstarted })
    }

    /// What changed since `version` (cards, page order, summary) and the log lines after
    /// `seq`, as one server-sent event's data.
    pub(crate) fn update_since(&self, version: u64, seq: u64) -> Value {
        let ordered = self.ordered();
        let cards: serde_json::Map<String, Value> = ordered
            .iter()
            .filter(|e| e.version > version)
            .map(|e| (e.view.name.clone(), Value::String(e.html.clone())))
            .collect();
        let views: Vec<&LoopView> = ordered.iter().map(|e| &e.view).collect();
        let log: Vec<String> = self
            .log
            .iter()
            .filter(|(s, _, _)| *s > seq)
            .map(|(_, n, l)| page::log_line(n, l))
            .collect();
        json!({
            "version": self.version,
            "seq": self.seq,
            "at": crate::state::now(),
            "order": ordered.iter().map(|e| e.view.name.as_str()).collect::<Vec<_>>(),
            "loops": cards,
            "summary": page::summary(&views),
            "log": log,
        })
    }

    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }
}
