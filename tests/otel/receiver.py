#!/usr/bin/env python3
"""An OTLP/HTTP trace receiver for loopflow's tests: decodes what arrives with the
OpenTelemetry project's own definitions (the `opentelemetry-proto` package: protobuf for
application/x-protobuf, google.protobuf.json_format for application/json) and appends
each request, as the OTLP JSON mapping of the decoded message, one line per request, to
OUT. Usage: receiver.py OUT [MODE]; prints the port it listens on (127.0.0.1) on stdout.

MODE: ok (answer 200), slow (answer after 30 s), garbage (answer bytes that are no
HTTP), error (answer 500). A request that does not decode is recorded as
{"error": "..."} and answered 400, so a test sees it.
"""
import base64
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

OUT = sys.argv[1]
MODE = sys.argv[2] if len(sys.argv) > 2 else "ok"
LOCK = threading.Lock()


def record(doc):
    with LOCK, open(OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps(doc) + "\n")


def otlp_json_ids(body):
    """OTLP/JSON departs from the proto3 JSON mapping in one way that matters here: trace
    and span ids are hex, not base64 (opentelemetry-proto/docs/specification.md, "JSON
    Protobuf Encoding"). They are turned into base64 so json_format can parse the rest;
    an id that is not hex of the right length is refused."""
    doc = json.loads(body.decode("utf-8"))
    sizes = {"traceId": 16, "spanId": 8, "parentSpanId": 8}
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for key, size in sizes.items():
                    h = sp.get(key, "")
                    if key == "parentSpanId" and h == "":
                        continue
                    raw = bytes.fromhex(h)
                    if len(raw) != size or h != h.lower():
                        raise ValueError(f"{key} {h!r} is not {size} bytes of lowercase hex")
                    sp[key] = base64.b64encode(raw).decode()
    return json.dumps(doc)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        kind = self.headers.get("Content-Type", "")
        req = trace_service_pb2.ExportTraceServiceRequest()
        try:
            if kind == "application/x-protobuf":
                req.ParseFromString(body)
            elif kind == "application/json":
                json_format.Parse(otlp_json_ids(body), req)
            else:
                raise ValueError("content type " + kind)
            decoded = json_format.MessageToDict(req)
            # The protobuf JSON mapping writes bytes as base64; the ids are put back as
            # the lowercase hex W3C and OTLP/JSON use, from the decoded message itself.
            for rs_dict, rs in zip(decoded.get("resourceSpans", []), req.resource_spans):
                for ss_dict, ss in zip(rs_dict.get("scopeSpans", []), rs.scope_spans):
                    for sp_dict, sp in zip(ss_dict.get("spans", []), ss.spans):
                        sp_dict["traceId"] = sp.trace_id.hex()
                        sp_dict["spanId"] = sp.span_id.hex()
                        sp_dict["parentSpanId"] = sp.parent_span_id.hex()
            doc = {
                "path": self.path,
                "content_type": kind,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "request": decoded,
            }
            status = 200
        except Exception as e:  # a request the definitions refuse
            doc = {"path": self.path, "content_type": kind, "error": str(e)}
            status = 400
        record(doc)
        if MODE == "slow":
            time.sleep(30)
        if MODE == "garbage":
            self.wfile.write(b"\x00\x01 not http at all\r\n\r\n")
            self.wfile.flush()
            return
        if MODE == "error":
            status = 500
        out = b"{}"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
