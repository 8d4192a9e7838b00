//! Traces (DESIGN §14): with the standard OpenTelemetry variables set
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, …) or `[telemetry] otlp_endpoint` in
//! `.loopflow/config.toml`, each tick exports one trace over OTLP/HTTP — a root span
//! `tick <loop>` and a child per node that ran, with the nodes' real start and end — and
//! every process a node spawns gets `TRACEPARENT` naming its node's span, so an agent
//! that exports its own telemetry lands in the same trace.
//!
//! Nothing here runs when nothing is configured: [`Exporter::configured`] reads a few
//! variables and (only when `.loopflow/config.toml` exists) that file, and returns `None`.
//! Export is bounded ([`DEFAULT_TIMEOUT`]) and best-effort: a collector that is down,
//! slow or answers garbage costs the tick at most the bound and one `WARN`.

use std::path::Path;
use std::time::Duration;

use crate::config::telemetry::Protocol;

mod http;
mod otlp;

pub(crate) use otlp::{Span, Value, request};

/// How long the export at a tick's end may take (connect, send, answer), unless
/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` / `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds) say
/// otherwise, up to [`MAX_TIMEOUT`].
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how traces are sent.
#[derive(Debug, Clone)]
pub(crate) struct Exporter {
    /// The full traces URL (`…/v1/traces`).
    pub url: String,
    pub protocol: Protocol,
    pub headers: Vec<(String, String)>,
    /// Resource attributes: `service.name` first, then `OTEL_RESOURCE_ATTRIBUTES`.
    pub resource: Vec<(String, String)>,
    pub timeout: Duration,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `k=v,k2=v2` with percent-encoded values (the OTEL_* list format).
fn pairs(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            let v = percent_encoding::percent_decode_str(v.trim())
                .decode_utf8_lossy()
                .into_owned();
            Some((k.trim().to_string(), v))
        })
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

impl Exporter {
    /// The exporter the environment and `project`'s `.loopflow/config.toml` configure:
    /// `None` when neither names an endpoint (or `OTEL_SDK_DISABLED=true`),
    /// `Some(Err)` when what they name cannot be used (the tick says so in a `WARN`).
    pub(crate) fn configured(project: &Path) -> Option<Result<Exporter, String>> {
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return None;
        }
        let traces = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let base = var("OTEL_EXPORTER_OTLP_ENDPOINT");
        let file = if traces.is_none() || base.is_none() {
            let path = crate::config::project_config_path(project);
            if path.exists() {
                match crate::config::ProjectConfig::load(project) {
                    Ok(c) => c.telemetry,
                    Err(e) if traces.is_none() && base.is_none() => {
                        return Some(Err(format!("no trace exported: {e}")));
                    }
                    Err(_) => None,
                }
            } else {
                None
            }
        } else {
            None
        };
        let file = file.unwrap_or_default();
        let url = match (traces, base.or_else(|| file.otlp_endpoint.clone())) {
            (Some(t), _) => t,
            (None, Some(b)) => format!("{}/v1/traces", b.trim_end_matches('/')),
            (None, None) => return None,
        };
        Some(Exporter::new(url, file))
    }

    fn new(url: String, file: crate::config::telemetry::Telemetry) -> Result<Exporter, String> {
        let protocol = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        {
            Some(p) => Protocol::parse(p.trim()).ok_or_else(|| {
                format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL `{p}` is not supported: loopflow exports over OTLP/HTTP (`http/protobuf`, the default, or `http/json`)"
                )
            })?,
            None => file.protocol.unwrap_or(Protocol::Protobuf),
        };
        let headers = var("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .or_else(|| var("OTEL_EXPORTER_OTLP_HEADERS"))
            .map(|h| pairs(&h))
            .unwrap_or_default();
        let mut attrs = var("OTEL_RESOURCE_ATTRIBUTES")
            .map(|a| pairs(&a))
            .unwrap_or_default();
        let from_attrs = attrs
            .iter()
            .position(|(k, _)| k == "service.name")
            .map(|i| attrs.remove(i).1);
        let service = var("OTEL_SERVICE_NAME")
            .or(from_attrs)
            .or(file.service_name)
            .unwrap_or_else(|| "loopflow".into());
        let mut resource = vec![("service.name".to_string(), service)];
        resource.extend(attrs);
        let timeout = var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .or_else(|| var("OTEL_EXPORTER_OTLP_TIMEOUT"))
            .and_then(|t| t.trim().parse::<u64>().ok())
            .map_or(DEFAULT_TIMEOUT, |ms| {
                Duration::from_millis(ms).min(MAX_TIMEOUT)
            });
        http::check_url(&url)?;
        Ok(Exporter {
            url,
            protocol,
            headers,
            resource,
            timeout,
        })
    }

    /// Sends `spans` (one trace) to the collector within the timeout; `Err` says what
    /// went wrong, for the tick's one `WARN`.
    pub(crate) fn export(&self, spans: &[Span]) -> Result<(), String> {
        let body = otlp::encode(&request(&self.resource, spans), self.protocol);
        let kind = match self.protocol {
            Protocol::Protobuf => "application/x-protobuf",
            Protocol::Json => "application/json",
        };
        http::post(&self.url, kind, &self.headers, &body, self.timeout)
    }
}

/// A tick's trace context: its trace id, its root span, the span it continues (a
/// `TRACEPARENT` loopflow itself was started with, e.g. by a CI system that traces its
/// jobs), and each node's span id, derived from the node's id so a process spawned for
/// the node can be handed it before the node's span exists.
#[derive(Debug, Clone)]
pub struct TraceIds {
    pub trace: [u8; 16],
    pub root: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub trace_state: Option<String>,
    /// Whether the trace is recorded (W3C `sampled`); an incoming unsampled context is
    /// honoured: propagated, not exported.
    pub sampled: bool,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N
        || !s
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    (out != [0u8; N]).then_some(out)
}

/// A W3C `traceparent` (`00-<trace>-<span>-<flags>`): trace id, span id, sampled.
pub(crate) fn parse_traceparent(s: &str) -> Option<([u8; 16], [u8; 8], bool)> {
    let parts: Vec<&str> = s.trim().split('-').collect();
    let [version, trace, span, flags] = parts[..] else {
        return None;
    };
    if version != "00" || flags.len() != 2 {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((unhex(trace)?, unhex(span)?, flags & 1 == 1))
}

/// Fresh random bytes from the kernel (one read per tick that traces).
fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    // SAFETY: getrandom writes at most `N` bytes into the buffer it is given.
    let got = unsafe { libc::getrandom(out.as_mut_ptr().cast(), N, 0) };
    if usize::try_from(got).ok() != Some(N) || out == [0u8; N] {
        // No entropy call (or an absurd all-zero draw): still unique enough per tick.
        let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
        out.copy_from_slice(&blake3::hash(seed.as_bytes()).as_bytes()[..N]);
    }
    out
}

impl TraceIds {
    /// A new trace, or the one `TRACEPARENT` in loopflow's environment names (the tick's
    /// root span then is a child of that span).
    pub fn start() -> TraceIds {
        let incoming = var("TRACEPARENT").and_then(|t| parse_traceparent(&t));
        match incoming {
            Some((trace, parent, sampled)) => TraceIds {
                trace,
                root: random(),
                parent: Some(parent),
                trace_state: var("TRACESTATE"),
                sampled,
            },
            None => TraceIds {
                trace: random(),
                root: random(),
                parent: None,
                trace_state: None,
                sampled: true,
            },
        }
    }

    /// The span id of node `id` in this trace.
    pub fn span_of(&self, id: &str) -> [u8; 8] {
        let mut h = blake3::Hasher::new();
        h.update(&self.trace);
        h.update(&self.root);
        h.update(id.as_bytes());
        let mut out = [0u8; 8];
        out.copy_from_slice(&h.finalize().as_bytes()[..8]);
        if out == [0u8; 8] {
            out[7] = 1;
        }
        out
    }

    /// `TRACEPARENT` for the processes node `id` spawns.
    pub fn traceparent(&self, id: &str) -> String {
        format!(
            "00-{}-{}-{}",
            hex(&self.trace),
            hex(&self.span_of(id)),
            if self.sampled { "01" } else { "00" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_refuses_what_w3c_refuses() {
        let ids = TraceIds {
            trace: [7; 16],
            root: [9; 8],
            parent: None,
            trace_state: None,
            sampled: true,
        };
        let tp = ids.traceparent("implement");
        let (t, s, sampled) = parse_traceparent(&tp).unwrap();
        assert_eq!(t, [7; 16]);
        assert_eq!(s, ids.span_of("implement"));
        assert!(sampled);
        assert_ne!(ids.span_of("implement"), ids.span_of("verify"));
        for bad in [
            "",
            "00-00000000000000000000000000000000-0102030405060708-01",
            "00-0102030405060708090a0b0c0d0e0f10-0000000000000000-01",
            "01-0102030405060708090a0b0c0d0e0f10-0102030405060708-01",
            "00-0102030405060708090A0B0C0D0E0F10-0102030405060708-01",
            "00-0102030405060708090a0b0c0d0e0f10-0102030405060708",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn otel_lists_are_percent_decoded() {
        assert_eq!(
            pairs("a=1, b = x%20y ,bad,=c"),
            [("a".into(), "1".into()), ("b".into(), "x y".into())]
        );
    }
}
