//! The OTLP trace request, built with the OpenTelemetry project's own generated types
//! (`opentelemetry-proto`: prost for `http/protobuf`, its serde for `http/json`), from the
//! spans a tick recorded.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status, span, status};
use prost::Message as _;

use crate::config::telemetry::Protocol;

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// One finished span of a tick's trace.
#[derive(Debug, Clone)]
pub(crate) struct Span {
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: Vec<(&'static str, Value)>,
    /// `Some(message)`: the span ended in error (an aborted tick, a failed node).
    pub error: Option<String>,
    pub trace: [u8; 16],
    pub trace_state: Option<String>,
    /// The parent is another process's span (`TRACEPARENT` loopflow was started with).
    pub remote_parent: bool,
}

fn any(v: &Value) -> AnyValue {
    AnyValue {
        value: Some(match v {
            Value::Str(s) => any_value::Value::StringValue(s.clone()),
            Value::Int(i) => any_value::Value::IntValue(*i),
            Value::Float(f) => any_value::Value::DoubleValue(*f),
            Value::Bool(b) => any_value::Value::BoolValue(*b),
        }),
    }
}

fn kv(key: &str, v: &Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(any(v)),
        ..Default::default()
    }
}

/// The export request for one trace: the resource (`service.name`, …), loopflow's scope,
/// the spans.
pub(crate) fn request(resource: &[(String, String)], spans: &[Span]) -> ExportTraceServiceRequest {
    let spans = spans
        .iter()
        .map(|s| opentelemetry_proto::tonic::trace::v1::Span {
            trace_id: s.trace.to_vec(),
            span_id: s.span_id.to_vec(),
            trace_state: s.trace_state.clone().unwrap_or_default(),
            parent_span_id: s.parent.map(|p| p.to_vec()).unwrap_or_default(),
            // W3C flags (sampled), and whether the parent is known to be remote.
            flags: 0x100 | if s.remote_parent { 0x200 } else { 0 } | 1,
            name: s.name.clone(),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: s.start_ns,
            end_time_unix_nano: s.end_ns.max(s.start_ns),
            attributes: s.attributes.iter().map(|(k, v)| kv(k, v)).collect(),
            status: Some(match &s.error {
                Some(m) => Status {
                    message: m.clone(),
                    code: status::StatusCode::Error as i32,
                },
                None => Status {
                    message: String::new(),
                    code: status::StatusCode::Unset as i32,
                },
            }),
            ..Default::default()
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: resource
                    .iter()
                    .map(|(k, v)| kv(k, &Value::Str(v.clone())))
                    .collect(),
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "loopflow".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// The request's bytes in `protocol`'s encoding.
pub(super) fn encode(req: &ExportTraceServiceRequest, protocol: Protocol) -> Vec<u8> {
    match protocol {
        Protocol::Protobuf => req.encode_to_vec(),
        Protocol::Json => serde_json::to_vec(req).unwrap_or_default(),
    }
}
