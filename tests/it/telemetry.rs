//! Traces (DESIGN §14), tested against the wire format: a receiver on 127.0.0.1
//! (`tests/otel/receiver.py`) decodes what loopflow sends with the OpenTelemetry project's
//! own definitions (the Python `opentelemetry-proto` package) for both `http/protobuf` and
//! `http/json`, and the tests assert the span tree, the attributes, the timing and the
//! `TRACEPARENT` each agent saw. A collector that is dead, slow, answers garbage or 500s
//! changes nothing but one `WARN`. The tests skip when Python or the package is missing,
//! unless `LOOPFLOW_REQUIRE_OTEL` is set (`.ci/run` sets it and installs the package).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::support::{Project, Run, wait_until};

/// A running receiver, stopped when dropped.
struct Receiver {
    child: Child,
    port: u16,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

fn receiver_available() -> bool {
    let ok = Command::new("python3")
        .args([
            "-c",
            "import opentelemetry.proto.collector.trace.v1.trace_service_pb2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("LOOPFLOW_REQUIRE_OTEL").is_none(),
            "LOOPFLOW_REQUIRE_OTEL is set but python3 with opentelemetry-proto is missing (pip install opentelemetry-proto)"
        );
        eprintln!("NOTICE: skipping the OTLP tests: no python3 with opentelemetry-proto");
    }
    ok
}

impl Receiver {
    fn start(mode: &str) -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("requests.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otel/receiver.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(&out)
            .arg(mode)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the receiver prints its port");
        Receiver {
            child,
            port,
            out,
            _dir: dir,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The requests received so far, decoded.
    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loop whose agent records, per role, the `TRACEPARENT` it got and whether it sees the
/// OTLP endpoint and headers variables, then implements, verifies (0.5) and orchestrates.
fn traced_project() -> (Project, PathBuf) {
    let p = Project::new();
    let seen = p.join("seen.log");
    let agent = p.script(
        "agent.sh",
        &format!(
            r#"echo "$1 ${{TRACEPARENT:-none}} ${{OTEL_EXPORTER_OTLP_ENDPOINT:-none}} ${{OTEL_EXPORTER_OTLP_HEADERS:-none}}" >> "{seen}"
case "$1" in
  implement) echo work >> work.txt; echo implemented ;;
  verify) echo '{{"pass": false, "score": 0.5, "cost_usd": 0.01}}' ;;
  orchestrate) echo orchestrated ;;
esac"#,
            seen = seen.display()
        ),
    );
    p.agent_loop("l", &agent, "score_plateau_window = 50");
    (p, seen)
}

/// `loopflow run --loop l --json` with `env` and no OTEL_*/TRACEPARENT of the test's own.
fn tick(p: &Project, env: &[(&str, &str)]) -> Run {
    let mut c = p.lf_cmd(&["run", "--loop", "l", "--json"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") || k == "TRACEPARENT" || k == "TRACESTATE" {
            c.env_remove(k);
        }
    }
    c.envs(env.iter().copied());
    Run::of(&mut c)
}

fn spans(request: &Value) -> Vec<Value> {
    let rs = &request["request"]["resourceSpans"];
    assert_eq!(rs.as_array().map(Vec::len), Some(1), "{request}");
    let ss = &rs[0]["scopeSpans"];
    assert_eq!(ss[0]["scope"]["name"], "loopflow", "{request}");
    ss[0]["spans"].as_array().unwrap().clone()
}

/// A span attribute's value as the OTLP JSON mapping gives it (`{"stringValue": …}`).
fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn nanos(v: &Value) -> u128 {
    v.as_str().unwrap().parse().unwrap()
}

/// Checks one exported tick: the tree, the attributes, the timing, and that each agent's
/// `TRACEPARENT` named its own node's span.
fn assert_tick_trace(request: &Value, seen: &Path, content_type: &str) {
    assert!(
        request.get("error").is_none(),
        "the receiver refused it: {request}"
    );
    assert_eq!(request["path"], "/v1/traces");
    assert_eq!(request["content_type"], content_type);
    let resource = &request["request"]["resourceSpans"][0]["resource"];
    assert!(
        resource["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["key"] == "service.name" && a["value"]["stringValue"] == "loopflow"),
        "{resource}"
    );
    let spans = spans(request);
    let root: Vec<&Value> = spans.iter().filter(|s| s["parentSpanId"] == "").collect();
    assert_eq!(root.len(), 1, "one root: {spans:?}");
    let root = root[0];
    assert_eq!(root["name"], "tick l");
    assert_eq!(attr(root, "loopflow.loop").unwrap()["stringValue"], "l");
    assert_eq!(
        attr(root, "loopflow.outcome").unwrap()["stringValue"],
        "tick"
    );
    assert_eq!(attr(root, "loopflow.iteration").unwrap()["intValue"], "1");
    assert_eq!(
        attr(root, "loopflow.verdict.pass").unwrap()["boolValue"],
        false
    );
    assert_eq!(
        attr(root, "loopflow.verdict.score").unwrap()["doubleValue"],
        0.5
    );
    assert_eq!(
        attr(root, "loopflow.spent.usd").unwrap()["doubleValue"],
        0.01
    );
    let trace = root["traceId"].as_str().unwrap();
    assert_eq!(trace.len(), 32);
    let (r0, r1) = (
        nanos(&root["startTimeUnixNano"]),
        nanos(&root["endTimeUnixNano"]),
    );
    assert!(r0 < r1);
    let children: Vec<&Value> = spans.iter().filter(|s| s["parentSpanId"] != "").collect();
    let names: Vec<&str> = children
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    for n in [
        "gate",
        "floor-check",
        "implement",
        "verify",
        "parse",
        "orchestrate",
        "commit",
    ] {
        assert!(names.contains(&n), "no span for node {n}: {names:?}");
    }
    let by_name = |n: &str| *children.iter().find(|s| s["name"] == n).unwrap();
    for c in &children {
        assert_eq!(c["traceId"], trace);
        assert_eq!(c["parentSpanId"], root["spanId"]);
        let (c0, c1) = (nanos(&c["startTimeUnixNano"]), nanos(&c["endTimeUnixNano"]));
        assert!(r0 <= c0 && c0 <= c1 && c1 <= r1, "{c} outside the tick");
        assert_eq!(attr(c, "loopflow.node").unwrap()["stringValue"], c["name"]);
        assert_eq!(
            attr(c, "loopflow.node.status").unwrap()["stringValue"],
            "ok"
        );
        assert_eq!(attr(c, "loopflow.node.attempts").unwrap()["intValue"], "1");
    }
    // The nodes ran one after another: implement before verify before commit.
    let end = |n: &str| nanos(&by_name(n)["endTimeUnixNano"]);
    let start = |n: &str| nanos(&by_name(n)["startTimeUnixNano"]);
    assert!(end("implement") <= start("verify"));
    assert!(end("verify") <= start("commit"));
    let implement = by_name("implement");
    assert_eq!(
        attr(implement, "loopflow.node.kind").unwrap()["stringValue"],
        "harness"
    );
    assert_eq!(
        attr(implement, "loopflow.node.role").unwrap()["stringValue"],
        "implement"
    );
    assert_eq!(
        attr(implement, "process.exit.code").unwrap()["intValue"],
        "0"
    );
    // Each agent was handed its own node's span.
    let seen = std::fs::read_to_string(seen).unwrap();
    for (role, node) in [("implement", "implement"), ("verify", "verify")] {
        let line = seen
            .lines()
            .rev()
            .find(|l| l.starts_with(&format!("{role} ")))
            .unwrap_or_else(|| panic!("{role} did not run: {seen}"));
        let tp = line.split(' ').nth(1).unwrap();
        let span = by_name(node)["spanId"].as_str().unwrap();
        assert_eq!(tp, format!("00-{trace}-{span}-01"), "{line}");
    }
}

#[test]
fn a_tick_exports_one_trace_over_protobuf_and_over_json() {
    if !receiver_available() {
        return;
    }
    let (p, seen) = traced_project();
    let rx = Receiver::start("ok");
    let endpoint = rx.endpoint();
    let r = tick(
        &p,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cret%20key"),
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["outcome"], "tick");
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 1, "one trace per tick: {reqs:?}");
    assert_tick_trace(&reqs[0], &seen, "application/x-protobuf");
    assert_eq!(reqs[0]["headers"]["x-api-key"], "s3cret key");
    // The agent sees where to send its own telemetry, not the backend's key.
    let last = std::fs::read_to_string(&seen).unwrap();
    assert!(
        last.lines()
            .all(|l| l.contains(&endpoint) && l.ends_with(" none")),
        "{last}"
    );
    assert!(!p.read(".loopflow/loops/l/.state.log").contains("WARN"));

    // http/json, and a TRACEPARENT loopflow was started with: the tick joins that trace.
    let parent_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_span = "00f067aa0ba902b7";
    let r = tick(
        &p,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_SERVICE_NAME", "nightly-loops"),
            (
                "TRACEPARENT",
                &format!("00-{parent_trace}-{parent_span}-01"),
            ),
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 2);
    let j = &reqs[1];
    assert_eq!(j["content_type"], "application/json");
    assert!(j.get("error").is_none(), "{j}");
    let spans = spans(j);
    let root = spans.iter().find(|s| s["name"] == "tick l").unwrap();
    assert_eq!(root["traceId"], parent_trace);
    assert_eq!(root["parentSpanId"], parent_span);
    assert!(spans.iter().all(|s| s["traceId"] == parent_trace));
    assert_eq!(attr(root, "loopflow.iteration").unwrap()["intValue"], "2");
    let service = &j["request"]["resourceSpans"][0]["resource"]["attributes"];
    assert!(
        service
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["key"] == "service.name" && a["value"]["stringValue"] == "nightly-loops"),
        "{service}"
    );
}

#[test]
fn skip_and_halt_ticks_export_and_config_toml_configures_it() {
    if !receiver_available() {
        return;
    }
    let (p, _) = traced_project();
    let rx = Receiver::start("ok");
    p.write(
        ".loopflow/config.toml",
        &format!(
            "[telemetry]\notlp_endpoint = \"{}\"\nprotocol = \"http/json\"\n",
            rx.endpoint()
        ),
    );
    let check = p.lf(&["check", ".loopflow/config.toml"]);
    assert_eq!(check.code, 0, "{check:?}");
    assert_eq!(p.lf(&["halt", "--loop", "l", "--reason", "look"]).code, 0);
    let r = tick(&p, &[]);
    assert_eq!(r.json()["outcome"], "skip", "{r:?}");
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(reqs[0]["content_type"], "application/json");
    let spans = spans(&reqs[0]);
    // The gate ran and said skip; nothing after it.
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["tick l", "gate"], "{spans:?}");
    assert_eq!(
        attr(&spans[1], "loopflow.node.status").unwrap()["stringValue"],
        "skip"
    );
    assert_eq!(
        attr(&spans[0], "loopflow.outcome").unwrap()["stringValue"],
        "skip"
    );
    assert!(
        attr(&spans[0], "loopflow.skip_reason").unwrap()["stringValue"]
            .as_str()
            .unwrap()
            .starts_with("halted:"),
        "{spans:?}"
    );
    // A bad [telemetry] is `check`'s to report, at its line.
    p.write(
        ".loopflow/config.toml",
        "[telemetry]\nprotocol = \"grpc\"\n",
    );
    let check = p.lf(&["check", ".loopflow/config.toml"]);
    assert_eq!(check.code, 3, "{check:?}");
    assert!(check.stdout.contains("config.toml:2:"), "{check:?}");
    assert!(check.stdout.contains("http/protobuf"), "{check:?}");
}

#[test]
fn a_dead_slow_or_broken_collector_changes_nothing_but_one_warn() {
    if !receiver_available() {
        return;
    }
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let receivers: Vec<(String, Option<Receiver>)> = vec![
        (dead, None),
        ("slow".into(), Some(Receiver::start("slow"))),
        ("garbage".into(), Some(Receiver::start("garbage"))),
        ("error".into(), Some(Receiver::start("error"))),
    ];
    for (what, rx) in &receivers {
        let (p, _) = traced_project();
        let endpoint = rx.as_ref().map_or(what.clone(), Receiver::endpoint);
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "700"),
        ];
        for i in 1..=2 {
            let r = tick(&p, &env);
            assert_eq!(r.code, 0, "{what}: {r:?}");
            assert_eq!(r.json()["outcome"], "tick", "{what}: {r:?}");
            assert_eq!(p.state("l")["iteration_count"], i, "{what}");
            assert!(r.stderr.contains("trace was not exported"), "{what}: {r:?}");
        }
        let log = p.read(".loopflow/loops/l/.state.log");
        let warns: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ")).collect();
        assert_eq!(warns.len(), 2, "one WARN per tick ({what}): {log}");
        assert!(
            warns.iter().all(|w| w.contains(&endpoint)),
            "{what}: {warns:?}"
        );
        if let Some(rx) = rx {
            wait_until("the collector to have seen both", || {
                rx.requests().len() == 2
            });
        }
    }
}

#[test]
fn nothing_is_exported_or_handed_on_when_nothing_is_configured() {
    let (p, seen) = traced_project();
    let r = tick(&p, &[]);
    assert_eq!(r.code, 0, "{r:?}");
    let seen = std::fs::read_to_string(seen).unwrap();
    assert!(
        seen.lines().all(|l| l.split(' ').nth(1) == Some("none")),
        "{seen}"
    );
    // An https endpoint is refused in one WARN saying what to do instead.
    let r = tick(
        &p,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://api.example.com")],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("OpenTelemetry Collector"), "{r:?}");
}

/// An agent that exports a span of its own to the collector loopflow names (Python, with
/// the same `opentelemetry-proto` definitions), parented on the `TRACEPARENT` it got.
const SELF_TRACING_AGENT: &str = r#"#!/usr/bin/env python3
import os, sys, time, urllib.request
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
role = sys.argv[1]
tp = os.environ["TRACEPARENT"].split("-")
req = trace_service_pb2.ExportTraceServiceRequest()
span = req.resource_spans.add().scope_spans.add().spans.add()
span.trace_id = bytes.fromhex(tp[1])
span.parent_span_id = bytes.fromhex(tp[2])
span.span_id = os.urandom(8)
span.name = "agent " + role
span.start_time_unix_nano = time.time_ns()
span.end_time_unix_nano = time.time_ns() + 1000
url = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] + "/v1/traces"
r = urllib.request.Request(url, data=req.SerializeToString(), headers={"Content-Type": "application/x-protobuf"})
urllib.request.urlopen(r, timeout=10).read()
if role == "verify":
    print('{"pass": false, "score": 0.5}')
"#;

#[test]
fn an_agent_that_exports_its_own_spans_lands_under_its_node() {
    if !receiver_available() {
        return;
    }
    let p = Project::new();
    let agent = p.write("agent.py", SELF_TRACING_AGENT);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let rx = Receiver::start("ok");
    p.with_loop(
        "l",
        &crate::support::LoopToml::new()
            .harness_agent(&agent)
            .brakes("score_plateau_window = 50")
            // The collector is on loopback: the agent may reach it.
            .table("sandbox", "network = \"open\""),
    );
    let r = tick(&p, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint())]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let reqs = rx.requests();
    // implement, verify and orchestrate each sent one; loopflow sent the tick's.
    assert_eq!(reqs.len(), 4, "{reqs:?}");
    let tick_spans = spans(reqs.last().unwrap());
    let root = tick_spans.iter().find(|s| s["name"] == "tick l").unwrap();
    for role in ["implement", "verify", "orchestrate"] {
        let theirs = reqs
            .iter()
            .flat_map(|r| {
                r["request"]["resourceSpans"][0]["scopeSpans"][0]["spans"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .find(|s| s["name"] == format!("agent {role}"))
            .unwrap_or_else(|| panic!("no span from the {role} agent: {reqs:?}"));
        let node = tick_spans.iter().find(|s| s["name"] == role).unwrap();
        assert_eq!(theirs["traceId"], root["traceId"], "{role}");
        assert_eq!(theirs["parentSpanId"], node["spanId"], "{role}");
    }
}

#[test]
fn the_daemon_exports_every_loops_tick_and_a_slow_collector_stops_none() {
    if !receiver_available() {
        return;
    }
    for mode in ["ok", "slow"] {
        let (p, _) = traced_project();
        let agent = p.join("agent.sh");
        p.agent_loop("m", &agent, "score_plateau_window = 50");
        let rx = Receiver::start(mode);
        let mut c = p.lf_cmd(&[
            "daemon",
            "--all",
            "--max-iterations",
            "2",
            "--max-concurrent",
            "2",
        ]);
        for (k, _) in std::env::vars() {
            if k.starts_with("OTEL_") || k == "TRACEPARENT" {
                c.env_remove(k);
            }
        }
        c.env("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint())
            .env("OTEL_EXPORTER_OTLP_TIMEOUT", "700");
        let r = Run::of(&mut c);
        assert_eq!(r.code, 0, "{mode}: {r:?}");
        // Each loop ticked once and its trace went out (or, slow, was given up on).
        for l in ["l", "m"] {
            assert_eq!(p.state(l)["iteration_count"], 1, "{mode}: {l}");
            let warned = p
                .read(&format!(".loopflow/loops/{l}/.state.log"))
                .contains("trace was not exported");
            assert_eq!(warned, mode == "slow", "{mode}: {l}");
        }
        wait_until("both traces at the collector", || rx.requests().len() == 2);
        let mut roots: Vec<String> = rx
            .requests()
            .iter()
            .map(|q| {
                spans(q).iter().find(|s| s["parentSpanId"] == "").unwrap()["name"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        roots.sort();
        assert_eq!(roots, ["tick l", "tick m"], "{mode}");
    }
}

#[test]
fn an_aborted_tick_exports_with_its_failed_node_in_error() {
    if !receiver_available() {
        return;
    }
    let p = Project::new();
    let agent = p.script("agent.sh", "exit 1");
    p.agent_loop("l", &agent, "max_consecutive_aborts = 5");
    let rx = Receiver::start("ok");
    let r = tick(&p, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint())]);
    assert_eq!(r.json()["outcome"], "abort", "{r:?}");
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let spans = spans(&reqs[0]);
    let root = spans.iter().find(|s| s["name"] == "tick l").unwrap();
    assert_eq!(
        attr(root, "loopflow.outcome").unwrap()["stringValue"],
        "abort"
    );
    assert!(attr(root, "loopflow.abort_reason").is_some(), "{root}");
    assert_eq!(root["status"]["code"], "STATUS_CODE_ERROR", "{root}");
    let implement = spans.iter().find(|s| s["name"] == "implement").unwrap();
    assert_eq!(
        implement["status"]["code"], "STATUS_CODE_ERROR",
        "{implement}"
    );
    assert_eq!(
        attr(implement, "loopflow.node.status").unwrap()["stringValue"],
        "failed"
    );
    assert_eq!(
        attr(implement, "process.exit.code").unwrap()["intValue"],
        "1"
    );
    // Nothing ran after the failed node.
    assert!(spans.iter().all(|s| s["name"] != "verify"), "{spans:?}");
}
