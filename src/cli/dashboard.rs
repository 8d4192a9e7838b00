//! `loopflow dashboard`: the project's loops on a live, read-only page on 127.0.0.1. The
//! address goes to stdout (one line, so a script or test can read it); progress to stderr.

use std::io::Write;
use std::path::Path;

use clap::Args;

use crate::dashboard::Model;
use crate::exit;
use crate::projects::Source;

#[derive(Args, Debug)]
#[command(
    after_help = "Serves http://127.0.0.1:PORT/ until stopped (Ctrl-C): every loop with its state, task, \
iterations, spend, score chart and last verdict, halted loops first with the commands to review and approve them, \
the five-deaths audit and a live log tail. GET /api/status is `status --json`; GET /events is a server-sent event \
stream. It never approves anything, and refuses requests whose Host is not its own address.\n\nExamples:\n  \
loopflow dashboard --open\n  loopflow dashboard --port 0   # a free port; the URL is printed"
)]
pub(crate) struct DashboardArgs {
    /// The port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 7171)]
    pub port: u16,
    /// Open the page in the default browser.
    #[arg(long)]
    pub open: bool,
    /// Every project in the registry (`loopflow projects`), loops named `project:loop`.
    #[arg(long)]
    pub all: bool,
}

/// Opens `url` with the platform's opener, without waiting for it.
fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else if cfg!(windows) {
        "explorer"
    } else {
        "xdg-open"
    };
    match crate::process::tool::start(&[opener, url]) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("warning: could not open a browser ({opener}: {e}); open {url} yourself")
        }
    }
}

/// Keeps the caches of the remote loops of `dirs` fresh: fetched now, then every 30 s in
/// the background; the page follows the cache files as it follows any loop's. Without a
/// remote loop (those at the start) no thread runs: an idle dashboard never wakes.
fn follow_remote_loops(dirs: Vec<std::path::PathBuf>) {
    let remote: Vec<crate::state::LoopPaths> = dirs
        .iter()
        .flat_map(|d| {
            crate::state::list_loops(d)
                .into_iter()
                .map(move |n| crate::state::LoopPaths::new(d, &n))
        })
        .filter(crate::remote::human::is_remote)
        .collect();
    if remote.is_empty() {
        return;
    }
    let refresh = move || {
        for paths in &remote {
            let _ = crate::remote::human::refresh_cache(paths);
        }
    };
    refresh();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(30));
            refresh();
        }
    });
}

pub(super) fn dashboard(project: &Path, a: DashboardArgs) -> i32 {
    follow_remote_loops(vec![project.to_path_buf()]);
    let model = Model::new(project);
    serve(model, &project.display().to_string(), a)
}

/// The dashboard over many projects (`--all`, `--project` more than once).
pub(super) fn dashboard_many(sources: &[Source], a: DashboardArgs) -> i32 {
    follow_remote_loops(sources.iter().map(|s| s.dir.clone()).collect());
    let model = Model::many(sources, true);
    let labels: Vec<&str> = sources.iter().map(|s| s.label.as_str()).collect();
    serve(
        model,
        &format!("{} projects ({})", sources.len(), labels.join(", ")),
        a,
    )
}

fn serve(model: Model, what: &str, a: DashboardArgs) -> i32 {
    let server = match crate::dashboard::Server::bind(model, a.port) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::STATE;
        }
    };
    let url = format!("http://{}/", server.addr());
    {
        let mut out = std::io::stdout().lock();
        // A closed stdout is no reason not to serve.
        let _ = writeln!(out, "{url}").and_then(|()| out.flush());
    }
    eprintln!("loopflow dashboard: serving {what} on {url} (read-only; Ctrl-C stops it)");
    if a.open {
        open_browser(&url);
    }
    match server.run() {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("error: {e}");
            exit::STATE
        }
    }
}
