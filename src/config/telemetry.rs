//! `[telemetry]` in `.loopflow/config.toml` (DESIGN §14): where each tick's trace goes when
//! the standard `OTEL_EXPORTER_OTLP_*` variables do not say. The variables win where both
//! are set, as the OpenTelemetry specification has environment configuration win.

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::toml_read::Table;

/// The OTLP/HTTP encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    Protobuf,
    Json,
}

impl Protocol {
    /// `http/protobuf` or `http/json`, as `OTEL_EXPORTER_OTLP_PROTOCOL` spells them.
    pub(crate) fn parse(s: &str) -> Option<Protocol> {
        match s {
            "http/protobuf" => Some(Protocol::Protobuf),
            "http/json" => Some(Protocol::Json),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Telemetry {
    /// The OTLP/HTTP base URL (`http://localhost:4318`); traces go to `<it>/v1/traces`.
    pub otlp_endpoint: Option<String>,
    pub protocol: Option<Protocol>,
    pub service_name: Option<String>,
}

pub(super) fn read(t: Option<Table<'_, '_>>, diags: &mut Diagnostics) -> Option<Telemetry> {
    let t = t?;
    t.deny_unknown(&["otlp_endpoint", "protocol", "service_name"], diags);
    let otlp_endpoint = t.str("otlp_endpoint", diags).and_then(|s| {
        if s.value.starts_with("http://") || s.value.starts_with("https://") {
            Some(s.value)
        } else {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    t.source,
                    s.span,
                    format!("`telemetry.otlp_endpoint` `{}` is not an http:// URL", s.value),
                )
                .label("not an OTLP/HTTP endpoint")
                .help("name the collector's OTLP/HTTP address: otlp_endpoint = \"http://localhost:4318\""),
            );
            None
        }
    });
    let protocol = t
        .str("protocol", diags)
        .and_then(|s| match Protocol::parse(&s.value) {
            Some(p) => Some(p),
            None => {
                diags.push(
                    Diagnostic::error(
                        Code::InvalidValue,
                        t.source,
                        s.span,
                        format!("`telemetry.protocol` cannot be `{}`", s.value),
                    )
                    .label("not an OTLP/HTTP protocol")
                    .help("use \"http/protobuf\" (the default) or \"http/json\""),
                );
                None
            }
        });
    let service_name = t.str("service_name", diags).map(|s| s.value);
    Some(Telemetry {
        otlp_endpoint,
        protocol,
        service_name,
    })
}
