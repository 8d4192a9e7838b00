//! Benchmark: `check` (parse + validate: keys, kinds, needs, cycles, templates against
//! the DAG) against merely parsing the same TOML, on one 5,000-node and one 10,000-node
//! pipeline and on 1,000 small pipeline files. Run with `cargo bench --bench check`.

use std::fmt::Write;
use std::time::Duration;

use loopflow::testing::{Diagnostics, Pipeline, Source};

/// A chain with fan-in: node i needs i-1 and (every 7th) i-7; command nodes read an
/// upstream node's exit code so template checks are exercised too.
fn big_pipeline(n: usize) -> String {
    let mut s = String::from("name = \"big\"\n\n[nodes.n0]\nkind = \"gate\"\n");
    for i in 1..n {
        let _ = write!(s, "\n[nodes.n{i}]\n");
        if i == n - 1 {
            s.push_str("kind = \"commit\"\n");
        } else {
            let _ = writeln!(
                s,
                "kind = \"command\"\nargv = [\"echo\", \"{{{{nodes.n{}.exit_code}}}}\", \"{{{{loop}}}}\"]",
                i - 1
            );
        }
        if i >= 7 && i % 7 == 0 {
            let _ = writeln!(s, "needs = [\"n{}\", \"n{}\"]", i - 1, i - 7);
        } else {
            let _ = writeln!(s, "needs = [\"n{}\"]", i - 1);
        }
    }
    s
}

/// CPU time of this thread: `check` does no I/O here, and on a shared VM wall time
/// also counts other tenants' work.
fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Medians of `a` and `b`, measured alternately in the same rounds so machine noise
/// hits both alike.
fn time2<A: FnMut(), B: FnMut()>(rounds: usize, mut a: A, mut b: B) -> (Duration, Duration) {
    let (mut va, mut vb) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let s = cpu_now();
        a();
        va.push(cpu_now() - s);
        let s = cpu_now();
        b();
        vb.push(cpu_now() - s);
    }
    va.sort();
    vb.sort();
    (va[rounds / 2], vb[rounds / 2])
}

fn report(label: &str, parse: Duration, check: Duration) {
    println!(
        "  {label:<28} parse {:>9.3} ms   check {:>9.3} ms   validation/parse {:>5.2}x",
        parse.as_secs_f64() * 1e3,
        check.as_secs_f64() * 1e3,
        (check.as_secs_f64() - parse.as_secs_f64()).max(0.0) / parse.as_secs_f64()
    );
}

fn main() {
    println!(
        "check benchmark (medians; `check` includes parsing, the ratio is the validation share)"
    );
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let sizes: &[usize] = if only == "files" {
        &[]
    } else {
        &[5_000, 10_000]
    };
    for &n in sizes {
        let text = big_pipeline(n);
        let src = Source::new("big.toml", "big.toml", text.clone());
        let (parse, check) = time2(
            15,
            || {
                let t = toml::de::DeTable::parse(&text).expect("parse");
                std::hint::black_box(t);
            },
            || {
                let mut d = Diagnostics::default();
                let p = Pipeline::load(&src, &mut d);
                assert!(!d.has_errors(), "{:?}", d.items.first());
                std::hint::black_box(p);
            },
        );
        report(&format!("{n}-node pipeline"), parse, check);
    }
    if only == "big" {
        return;
    }
    let files: Vec<String> = (0..1000).map(|i| big_pipeline(8 + i % 5)).collect();
    let (parse, check) = time2(
        15,
        || {
            for f in &files {
                std::hint::black_box(toml::de::DeTable::parse(f).expect("parse"));
            }
        },
        || {
            for (i, f) in files.iter().enumerate() {
                let src = Source::new(format!("p{i}.toml"), "p.toml", f.clone());
                let mut d = Diagnostics::default();
                std::hint::black_box(Pipeline::load(&src, &mut d));
            }
        },
    );
    report("1,000 pipeline files", parse, check);
}
