//! Benchmark: a full tick of the default pipeline whose agents are `true` (and `echo` for
//! the verifier's verdict), against the bare floor of spawning the same three processes
//! with output to files and writing one state file atomically. Reported as a ratio
//! measured in the same run; run with `cargo bench --bench tick`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use loopflow::testing::{CreateOptions, RunOptions, create, run_tick};

const VERDICT: &str = r#"{"pass": false, "score": 0.5}"#;

fn loop_toml() -> String {
    format!(
        r#"[brakes]
max_iterations = 1000000
context_tokens = 32000
score_plateau_window = 50

[harness]
command = ["true"]

[roles.implement]
prompt = "prompts/loop-implement.md"
[roles.verify]
prompt = "prompts/loop-verifier.md"
command = ["echo", {VERDICT:?}]
[roles.orchestrate]
prompt = "prompts/loop-orchestrate.md"

[worktree]
enabled = false
"#
    )
}

/// The floor: what any runner must do at the least. With `round`, each agent's output
/// goes to new per-tick files (as DESIGN §2's `outputs/<N>-<node>.*` asks of any runner);
/// without, to the same files every time (the barest possible floor).
fn floor(dir: &Path, round: Option<usize>) {
    for (i, argv) in [vec!["true"], vec!["echo", VERDICT], vec!["true"]]
        .iter()
        .enumerate()
    {
        let tag = round.map_or(String::new(), |r| format!("{r}-"));
        let out =
            std::fs::File::create(dir.join(format!("{tag}floor-{i}.stdout"))).expect("stdout file");
        let err =
            std::fs::File::create(dir.join(format!("{tag}floor-{i}.stderr"))).expect("stderr file");
        let status = Command::new(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .expect("spawn");
        assert!(status.success());
    }
    let state = dir.join("floor.state");
    loopflow::testing::write_atomic(dir, &state, b"{\"iteration_count\": 1}\n")
        .expect("atomic write");
}

/// The verifier always says 0.5; clear the score history (untimed) before the window
/// fills so the plateau brake never ends the benchmark.
fn reset_history(paths: &loopflow::testing::LoopPaths) {
    let mut s = paths.load().expect("state");
    if s.score_history.len() >= 40 {
        s.score_history.clear();
        loopflow::testing::save(&paths.state, &s).expect("save");
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let project = tempfile::tempdir().expect("tempdir");
    let floor_dir = tempfile::tempdir().expect("tempdir");
    let o = CreateOptions {
        name: "bench",
        template: "default",
        task: Some("benchmark".into()),
        worktree: false,
        harness: None,
    };
    let paths = create(project.path(), &o).expect("create loop");
    std::fs::write(paths.dir.join("loop.toml"), loop_toml()).expect("loop.toml");
    let exe = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/loopflow");
    let cli = exe.exists();
    let cancel = AtomicBool::new(false);
    let opts = RunOptions::default();

    // Warm up caches, page in binaries.
    for _ in 0..10 {
        floor(floor_dir.path(), None);
        run_tick(project.path(), "bench", &opts, &cancel).expect("tick");
    }
    let (mut f, mut fo, mut t, mut c) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let s = Instant::now();
        floor(floor_dir.path(), None);
        f.push(s.elapsed());
        let s = Instant::now();
        floor(floor_dir.path(), Some(round));
        fo.push(s.elapsed());
        let s = Instant::now();
        let sum = run_tick(project.path(), "bench", &opts, &cancel).expect("tick");
        t.push(s.elapsed());
        assert_eq!(format!("{:?}", sum.outcome), "Tick", "{sum:?}");
        reset_history(&paths);
        if cli {
            let s = Instant::now();
            let st = Command::new(&exe)
                .args(["--project"])
                .arg(project.path())
                .args(["run", "--loop", "bench"])
                .stdout(Stdio::null())
                .status()
                .expect("spawn loopflow");
            c.push(s.elapsed());
            assert!(st.success());
            reset_history(&paths);
        }
    }
    let (mf, mfo, mt) = (median(&mut f), median(&mut fo), median(&mut t));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("tick benchmark ({rounds} rounds, medians)");
    println!(
        "  floor A: 3 agents, output to reused files, 1 atomic write: {:>7.3} ms",
        ms(mf)
    );
    println!(
        "  floor B: the same, output to new per-tick files:           {:>7.3} ms",
        ms(mfo)
    );
    let row = |what: &str, d: Duration| {
        println!(
            "  {what:<59}{:>7.3} ms   {:.2}x A   {:.2}x B",
            ms(d),
            ms(d) / ms(mf),
            ms(d) / ms(mfo)
        )
    };
    row("loopflow tick in process (library run_tick):", mt);
    if cli {
        row(
            "loopflow run as a process (release binary):",
            median(&mut c),
        );
    } else {
        println!("  (build the release binary first to also time `loopflow run` as a process)");
    }
}
