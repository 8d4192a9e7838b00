#!/usr/bin/env python3
"""Scripted fake LLM server for running agent CLIs offline (stdlib only).

Usage:
    python3 fake_model_server.py --port 0 --log requests.jsonl --port-file port.txt

Binds 127.0.0.1. Writes the port to --port-file once listening. Appends one JSON line
per request to --log: {"ts", "method", "path", "query", "headers", "body", "reply"}.

APIs spoken (streaming where the client asks for it):
  Anthropic Messages      POST /v1/messages            (+ /v1/messages/count_tokens)
  OpenAI Responses        POST /v1/responses           (SSE)          -> Codex
  OpenAI Chat Completions POST /v1/chat/completions    (SSE or JSON)  -> OpenCode
  Gemini                  POST /v1beta/models/<m>:streamGenerateContent?alt=sse,
                          :generateContent, :countTokens              -> Gemini CLI
  GET /v1/models (OpenAI list), GET /health
A path prefix before /v1 or /v1beta is ignored (e.g. /anthropic/v1/messages).

Scripted behaviour, from markers anywhere in the user turns of the conversation:
  LOOPFLOW-ROLE: implement   -> one tool call writing LOOPFLOW-WRITE (default
                                loopflow-hello.txt) with LOOPFLOW-CONTENT (default
                                "hello from loopflow"), using the file-writing tool the
                                client advertised (Write / write / write_file /
                                apply_patch / a shell tool); after its result: "done".
                                A client that offers no tools (aider) gets the file in
                                aider's "whole" edit format instead.
  LOOPFLOW-ROLE: verify      -> a ```json fenced verdict; LOOPFLOW-SCORE: 0.9 sets the
                                score (default 0.9), pass = score >= 0.9.
  LOOPFLOW-ROLE: orchestrate -> "ok".
  LOOPFLOW-RUN: <command>    -> (any role) first one shell-tool call running <command>.
  LOOPFLOW-EXPECT: <text>    -> (verify) verdict fails (score 0) unless a tool result
                                contains <text>: proves the command really ran.
  LOOPFLOW-DELAY: <seconds>  -> sleep before answering.
  LOOPFLOW-HTTP-ERROR: <code>-> answer with that HTTP status and a provider-shaped error.
  LOOPFLOW-RATE-LIMIT: <s> [type] -> HTTP 429 in the provider's rate-limit shape with
                                `retry-after: <s>` (OpenAI's type: rate_limit_exceeded,
                                insufficient_quota or usage_limit_reached).
Requests without a role marker (titles, summaries, classifiers, schema calls) get a
short answer; a requested JSON schema gets a minimal instance of that schema.
Every reply carries usage with non-zero cache-read tokens (see USAGE below).
"""
import argparse
import json
import os
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

# Fixed usage numbers per model call, distinct so a preset's pointers can be checked.
# Anthropic semantics: input_tokens EXCLUDES cache tokens.
# OpenAI / Gemini semantics: prompt/input tokens INCLUDE cached tokens.
USAGE = {
    "input_uncached": 11,
    "cache_creation": 222,
    "cache_read": 3333,
    "output": 44,
}

WRITE_TOOLS = ["Write", "write", "write_file", "apply_patch", "create_file"]
SHELL_TOOLS = ["Bash", "bash", "run_shell_command", "exec_command", "shell_command",
               "shell", "local_shell", "container.exec"]

LOG_LOCK = threading.Lock()
LOG_PATH = None
COUNTER = [0]


def nid(prefix):
    COUNTER[0] += 1
    return "%s_%s%04d" % (prefix, uuid.uuid4().hex[:16], COUNTER[0])


# ---------------------------------------------------------------------------
# Normalised conversation
# ---------------------------------------------------------------------------
class Conv:
    def __init__(self):
        self.system = ""
        self.turns = []          # list of (role, text); role in user/assistant/tool
        self.tools = []          # list of dicts {name, kind, params}
        self.schema = None       # JSON schema requested for the answer, if any
        self.stream = False
        self.model = "fake-model"

    def user_texts(self):
        return [t for r, t in self.turns if r == "user"]

    def tool(self, name):
        for t in self.tools:
            if t["name"] == name:
                return t
        return None


def _text_of(content):
    """Flatten str / list-of-blocks content into text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        if "text" in content and isinstance(content["text"], str):
            return content["text"]
        if "content" in content:
            return _text_of(content["content"])
        return ""
    if isinstance(content, list):
        return "\n".join(_text_of(c) for c in content)
    return str(content)


def parse_anthropic(body):
    c = Conv()
    c.system = _text_of(body.get("system"))
    c.stream = bool(body.get("stream"))
    c.model = body.get("model") or c.model
    for m in body.get("messages", []):
        role = m.get("role")
        content = m.get("content")
        if isinstance(content, str):
            c.turns.append((role, content))
            continue
        texts = []
        for b in content or []:
            bt = b.get("type")
            if bt == "tool_result":
                c.turns.append(("tool", _text_of(b.get("content"))))
            elif bt == "text":
                texts.append(b.get("text", ""))
            elif bt == "tool_use":
                c.turns.append(("assistant_tool", b.get("name", "")))
        if texts:
            c.turns.append((role, "\n".join(texts)))
    for t in body.get("tools") or []:
        c.tools.append({"name": t.get("name", ""), "kind": t.get("type", "custom"),
                        "params": t.get("input_schema") or {}})
    of = body.get("output_format") or {}
    if isinstance(of, dict) and of.get("schema"):
        c.schema = of["schema"]
    return c


def parse_responses(body):
    c = Conv()
    c.system = _text_of(body.get("instructions"))
    c.stream = bool(body.get("stream"))
    c.model = body.get("model") or c.model
    inp = body.get("input")
    if isinstance(inp, str):
        c.turns.append(("user", inp))
    for it in inp if isinstance(inp, list) else []:
        ty = it.get("type", "message")
        if ty == "message":
            role = it.get("role")
            txt = _text_of(it.get("content"))
            if role in ("system", "developer"):
                c.system += "\n" + txt
            else:
                c.turns.append((role, txt))
        elif ty in ("function_call_output", "custom_tool_call_output",
                    "local_shell_call_output", "tool_search_output"):
            c.turns.append(("tool", _text_of(it.get("output"))))
        elif ty in ("function_call", "custom_tool_call", "local_shell_call"):
            c.turns.append(("assistant_tool", it.get("name", ty)))
    for t in body.get("tools") or []:
        ty = t.get("type")
        if ty == "function":
            c.tools.append({"name": t.get("name", ""), "kind": "function",
                            "params": t.get("parameters") or {}})
        elif ty == "custom":
            c.tools.append({"name": t.get("name", ""), "kind": "custom", "params": {}})
        elif ty == "local_shell":
            c.tools.append({"name": "local_shell", "kind": "local_shell", "params": {}})
        elif ty == "namespace":
            for sub in t.get("tools") or []:
                c.tools.append({"name": sub.get("name", ""), "kind": "function",
                                "params": sub.get("parameters") or {},
                                "namespace": t.get("name")})
        else:
            c.tools.append({"name": t.get("name") or ty or "", "kind": ty or "", "params": {}})
    fmt = ((body.get("text") or {}).get("format") or {})
    if fmt.get("type") == "json_schema":
        c.schema = fmt.get("schema") or {}
    return c


def parse_chat(body):
    c = Conv()
    c.stream = bool(body.get("stream"))
    c.model = body.get("model") or c.model
    for m in body.get("messages", []):
        role = m.get("role")
        txt = _text_of(m.get("content"))
        if role in ("system", "developer"):
            c.system += "\n" + txt
        elif role == "tool":
            c.turns.append(("tool", txt))
        else:
            if role == "assistant" and m.get("tool_calls"):
                for tc in m["tool_calls"]:
                    c.turns.append(("assistant_tool", (tc.get("function") or {}).get("name", "")))
            if txt:
                c.turns.append((role, txt))
    for t in body.get("tools") or []:
        f = t.get("function") or {}
        c.tools.append({"name": f.get("name", ""), "kind": "function",
                        "params": f.get("parameters") or {}})
    rf = body.get("response_format") or {}
    if rf.get("type") == "json_schema":
        c.schema = (rf.get("json_schema") or {}).get("schema") or {}
    elif rf.get("type") == "json_object":
        c.schema = {"type": "object"}
    return c


def parse_gemini(body, stream, model):
    c = Conv()
    c.stream = stream
    c.model = model
    c.system = _text_of((body.get("systemInstruction") or body.get("system_instruction") or {}).get("parts"))
    for m in body.get("contents", []):
        role = m.get("role", "user")
        texts = []
        for p in m.get("parts") or []:
            if "functionResponse" in p:
                c.turns.append(("tool", json.dumps(p["functionResponse"].get("response"))))
            elif "functionCall" in p:
                c.turns.append(("assistant_tool", p["functionCall"].get("name", "")))
            elif "text" in p and not p.get("thought"):
                texts.append(p["text"])
        if texts:
            c.turns.append(("assistant" if role == "model" else "user", "\n".join(texts)))
    for t in body.get("tools") or []:
        for f in t.get("functionDeclarations") or t.get("function_declarations") or []:
            c.tools.append({"name": f.get("name", ""), "kind": "function",
                            "params": f.get("parametersJsonSchema") or f.get("parameters") or {}})
    gc = body.get("generationConfig") or {}
    sch = gc.get("responseJsonSchema") or gc.get("responseSchema")
    if sch:
        c.schema = sch
    elif gc.get("responseMimeType") == "application/json":
        c.schema = {"type": "object"}
    return c


# ---------------------------------------------------------------------------
# Behaviour
# ---------------------------------------------------------------------------
def marker(texts, name):
    """Value of the last `NAME: value` marker found in texts (searched last to first)."""
    rx = re.compile(r"%s:[ \t]*([^\r\n]*)" % re.escape(name))
    for t in reversed(texts):
        ms = rx.findall(t)
        if ms:
            return ms[-1].strip()
    return None


CWD_PATTERNS = [
    r"<cwd>([^<\n]+)</cwd>",
    r"Primary working directory:\s*(\S[^\n]*)",
    r"Working directory:\s*(\S[^\n]*)",
    r"[Cc]urrent working directory[^:\n]*:\s*(/[^\n]*)",
    r"working in the directory:?\s*[`'\"]?(/[^\n`'\"]*)",
    r"Workspace Directories:\*\*\s*\n\s*-\s*(/[^\n]+)",
]


def find_cwd(conv):
    hay = [conv.system] + [t for r, t in conv.turns if r == "user"]
    for pat in CWD_PATTERNS:
        for h in hay:
            m = re.search(pat, h or "")
            if m:
                return m.group(1).strip().rstrip(".").strip()
    return None


def schema_instance(s, key=None, depth=0):
    """Minimal valid instance of a JSON schema (also Gemini's upper-case Schema)."""
    if not isinstance(s, dict) or depth > 8:
        return "ok"
    for k in ("anyOf", "oneOf", "allOf"):
        if s.get(k):
            return schema_instance(s[k][0], key, depth + 1)
    if "const" in s:
        return s["const"]
    if s.get("enum"):
        vals = s["enum"]
        if key == "next_speaker" and "user" in vals:
            return "user"
        return vals[0]
    ty = s.get("type")
    if isinstance(ty, list):
        ty = [t for t in ty if t != "null"][0] if [t for t in ty if t != "null"] else "null"
    ty = (ty or ("object" if "properties" in s else "string")).lower()
    if ty == "object":
        out = {}
        for k, v in (s.get("properties") or {}).items():
            out[k] = schema_instance(v, k, depth + 1)
        return out
    if ty == "array":
        n = int(s.get("minItems") or 0)
        return [schema_instance(s.get("items") or {}, key, depth + 1) for _ in range(n)]
    if ty in ("number", "integer"):
        v = s.get("minimum", 1)  # 1: several clients' validators reject 0 scores
        return int(v) if ty == "integer" else v
    if ty == "boolean":
        return key not in ("is_loop", "isLoop")
    if ty == "null":
        return None
    return "ok"


def verdict_text(score, reason="fake model server: scripted verdict"):
    v = {"pass": score >= 0.9, "score": score,
         "reasons": [reason],
         "next_hint": "none" if score >= 0.9 else "raise the score"}
    return "Verification finished.\n\n```json\n%s\n```\n" % json.dumps(v)


def _props(tool):
    p = tool.get("params") or {}
    return p.get("properties") or {}, p.get("required") or []


def build_write_call(conv, tool, relpath, content):
    name, kind = tool["name"], tool["kind"]
    cwd = find_cwd(conv)
    abspath = relpath if os.path.isabs(relpath) else (os.path.join(cwd, relpath) if cwd else relpath)
    if name == "apply_patch":
        patch = "*** Begin Patch\n*** Add File: %s\n%s*** End Patch\n" % (
            relpath, "".join("+" + l + "\n" for l in content.split("\n")))
        if kind == "custom":
            return {"name": name, "custom_input": patch}
        props, _ = _props(tool)
        key = "input" if "input" in props or not props else list(props)[0]
        return {"name": name, "args": {key: patch}}
    props, req = _props(tool)
    pkey = next((k for k in ("file_path", "filePath", "path", "absolute_path", "target_file")
                 if k in props), "file_path")
    ckey = next((k for k in ("content", "contents", "text", "file_text") if k in props), "content")
    args = {pkey: abspath, ckey: content}
    for r in req:
        if r not in args:
            args[r] = "write %s" % relpath if "desc" in r.lower() else ""
    return {"name": name, "args": args}


def build_shell_call(conv, tool, cmd):
    name, kind = tool["name"], tool["kind"]
    if kind == "local_shell":
        return {"name": name, "local_shell": ["bash", "-lc", cmd]}
    props, req = _props(tool)
    args = {}
    if "cmd" in props:
        args["cmd"] = cmd
    else:
        cp = props.get("command") or {}
        if cp.get("type") == "array":
            args["command"] = ["bash", "-lc", cmd]
        else:
            args["command"] = cmd
    for r in req:
        if r not in args:
            args[r] = "run %s" % cmd if "desc" in r.lower() else ""
    if "description" in props and "description" not in args:
        args["description"] = "run a command"
    return {"name": name, "args": args}


def decide(conv):
    """Return {"text": str} or {"call": {...}} plus meta info for the log."""
    utexts = conv.user_texts()
    role = marker(utexts, "LOOPFLOW-ROLE")
    if not conv.tools:
        hay = (conv.system or "") + "\n" + (utexts[-1] if utexts else "")
        if "<block>no</block>" in hay:  # Claude Code auto-mode safety classifier
            return {"text": "<block>no</block>", "kind": "classifier-allow"}
        if conv.schema is not None:
            return {"text": json.dumps(schema_instance(conv.schema)), "kind": "schema"}
        if re.search(r"title generator|generate (a |an )?(concise |short |brief )?"
                     r"(conversation |session )?title|\btitle for\b", conv.system or "", re.I):
            return {"text": "Loopflow task", "kind": "title"}
    if role is None:
        return {"text": "ok", "kind": "aux"}
    role = role.split()[0].lower() if role else ""
    # tool results after the last user text that holds the role marker
    idx = max(i for i, (r, t) in enumerate(conv.turns) if r == "user" and "LOOPFLOW-ROLE" in t)
    n_results = sum(1 for r, _ in conv.turns[idx + 1:] if r == "tool")
    steps = []
    run = marker(utexts, "LOOPFLOW-RUN")
    if run:
        steps.append(("shell", run))
    if role == "implement":
        steps.append(("write", marker(utexts, "LOOPFLOW-WRITE") or "loopflow-hello.txt"))
    if n_results < len(steps) and conv.tools:
        kind, arg = steps[n_results]
        names = [t["name"] for t in conv.tools]
        if kind == "write":
            content = (marker(utexts, "LOOPFLOW-CONTENT") or "hello from loopflow").replace("\\n", "\n")
            tname = next((n for n in WRITE_TOOLS if n in names), None)
            if tname:
                return {"call": build_write_call(conv, conv.tool(tname), arg, content),
                        "kind": "write", "role": role}
            sname = next((n for n in SHELL_TOOLS if n in names), None)
            if sname:
                d = os.path.dirname(arg)
                cmd = ("mkdir -p %s && " % sh_quote(d) if d else "") + \
                    "printf '%%s\\n' %s > %s" % (sh_quote(content), sh_quote(arg))
                return {"call": build_shell_call(conv, conv.tool(sname), cmd),
                        "kind": "write-via-shell", "role": role}
            return {"text": "no file-writing tool advertised: %s" % names, "kind": "error", "role": role}
        sname = next((n for n in SHELL_TOOLS if n in names), None)
        if sname:
            return {"call": build_shell_call(conv, conv.tool(sname), arg), "kind": "shell", "role": role}
        # no shell tool: skip straight to the final answer
    if role == "implement" and not conv.tools:
        # A client that edits from text (aider): the file in its "whole" edit format.
        path = marker(utexts, "LOOPFLOW-WRITE") or "loopflow-hello.txt"
        content = (marker(utexts, "LOOPFLOW-CONTENT") or "hello from loopflow").replace("\\n", "\n")
        return {"text": "%s\n```\n%s\n```\n" % (path, content), "kind": "write-as-text", "role": role}
    if role == "implement":
        return {"text": "done", "kind": "final", "role": role}
    if role == "verify":
        try:
            score = float(marker(utexts, "LOOPFLOW-SCORE") or 0.9)
        except ValueError:
            score = 0.9
        last_tool = [t for r, t in conv.turns[idx + 1:] if r == "tool"]
        expect = marker(utexts, "LOOPFLOW-EXPECT")
        if expect and not any(expect in t for t in last_tool):
            return {"text": verdict_text(0.0, "expected tool output %r not seen" % expect),
                    "kind": "verdict", "role": role}
        txt = verdict_text(score)
        if last_tool:
            txt = "Command output seen (%d chars).\n\n" % len(last_tool[-1]) + txt
        return {"text": txt, "kind": "verdict", "role": role}
    return {"text": "ok", "kind": "final", "role": role}


def sh_quote(s):
    return "'" + s.replace("'", "'\"'\"'") + "'"


# ---------------------------------------------------------------------------
# Wire formats
# ---------------------------------------------------------------------------
def anthropic_usage():
    return {"input_tokens": USAGE["input_uncached"],
            "cache_creation_input_tokens": USAGE["cache_creation"],
            "cache_read_input_tokens": USAGE["cache_read"],
            "output_tokens": USAGE["output"],
            "service_tier": "standard"}


def openai_prompt_tokens():
    return USAGE["input_uncached"] + USAGE["cache_creation"] + USAGE["cache_read"]


def chunks(s, n=40):
    return [s[i:i + n] for i in range(0, len(s), n)] or [""]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-model-server/1"

    def log_message(self, fmt, *args):  # quiet
        pass

    # -- plumbing --------------------------------------------------------
    def _read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not n and self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while True:
                line = self.rfile.readline().strip()
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                raw += self.rfile.read(size)
                self.rfile.readline()
        enc = self.headers.get("Content-Encoding", "").lower()
        if enc in ("gzip", "deflate"):
            import zlib
            raw = zlib.decompress(raw, 16 + zlib.MAX_WBITS if enc == "gzip" else zlib.MAX_WBITS)
        elif enc == "zstd":
            raise ValueError("zstd request bodies are not supported")
        try:
            return json.loads(raw.decode("utf-8")) if raw else {}
        except Exception:
            return {"_raw": raw[:2000].decode("utf-8", "replace")}

    def _log(self, body, reply):
        if not LOG_PATH:
            return
        hdrs = {}
        for k, v in self.headers.items():
            lk = k.lower()
            if lk in ("authorization", "x-api-key", "x-goog-api-key", "api-key", "cookie"):
                v = "<redacted %d chars>" % len(v)
            hdrs[lk] = v
        u = urlsplit(self.path)
        q = {k: v for k, v in parse_qs(u.query).items() if k != "key"}
        rec = {"ts": time.time(), "method": self.command, "path": u.path, "query": q,
               "headers": hdrs, "body": body, "reply": reply}
        line = json.dumps(rec) + "\n"
        with LOG_LOCK:
            with open(LOG_PATH, "a") as f:
                f.write(line)

    def _json(self, code, obj, extra_headers=None):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", nid("req"))
        for k, v in (extra_headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _sse_start(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.send_header("request-id", nid("req"))
        self.end_headers()
        self.close_connection = True

    def _sse(self, data, event=None):
        s = ""
        if event:
            s += "event: %s\n" % event
        s += "data: %s\n\n" % (data if isinstance(data, str) else json.dumps(data))
        self.wfile.write(s.encode())
        self.wfile.flush()

    # -- routing ---------------------------------------------------------
    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        path = urlsplit(self.path).path
        self._log(None, {"kind": "get"})
        if path.endswith("/models"):
            return self._json(200, {"object": "list", "data": [
                {"id": "fake-model", "object": "model", "created": 0, "owned_by": "loopflow"}]})
        if path in ("/", "/health", "/healthz"):
            return self._json(200, {"ok": True})
        return self._json(404, {"error": {"type": "not_found", "message": "no route %s" % path}})

    def do_POST(self):
        u = urlsplit(self.path)
        path = u.path
        try:
            body = self._read_body()
        except Exception as e:  # noqa
            self._log({"_error": str(e)}, {"kind": "bad-body"})
            return self._json(400, {"error": {"type": "invalid_request_error", "message": str(e)}})
        try:
            if path.endswith("/v1/messages/count_tokens"):
                self._log(body, {"kind": "count_tokens"})
                return self._json(200, {"input_tokens": openai_prompt_tokens()})
            if path.endswith("/v1/messages"):
                return self.anthropic(body)
            if path.endswith("/responses"):
                return self.openai_responses(body)
            if path.endswith("/chat/completions"):
                return self.chat(body)
            m = re.search(r"/models/([^/:]+):(streamGenerateContent|generateContent|countTokens)$", path)
            if m:
                return self.gemini(body, m.group(1), m.group(2))
            if path.endswith(":embedContent") or path.endswith(":batchEmbedContents"):
                self._log(body, {"kind": "embed"})
                return self._json(200, {"embedding": {"values": [0.0] * 8}})
        except (BrokenPipeError, ConnectionResetError):
            return
        self._log(body, {"kind": "404"})
        return self._json(404, {"error": {"type": "not_found", "message": "no route %s" % path}})

    def _pre(self, conv, body, api):
        """Apply delay / forced-error markers. Returns True if already answered."""
        ut = conv.user_texts()
        d = marker(ut, "LOOPFLOW-DELAY")
        if d and conv.tools:
            try:
                time.sleep(float(d))
            except ValueError:
                pass
        limit = marker(ut, "LOOPFLOW-RATE-LIMIT")
        if limit:  # a real limit refuses every request, titles included
            self._rate_limited(body, api, limit)
            return True
        code = marker(ut, "LOOPFLOW-HTTP-ERROR")
        if code and code.isdigit() and conv.tools:
            code = int(code)
            self._log(body, {"kind": "forced-error", "status": code})
            if api == "anthropic":
                et = "overloaded_error" if code == 529 else "api_error"
                self._json(code, {"type": "error", "error": {"type": et, "message": "forced"}})
            elif api == "gemini":
                self._json(code, {"error": {"code": code, "message": "forced", "status": "INTERNAL"}})
            else:
                self._json(code, {"error": {"message": "forced", "type": "server_error", "code": code}})
            return True
        return False

    def _rate_limited(self, body, api, spec):
        """HTTP 429 in the provider's own shape, with the headers its real API sends.
        `spec` is `<seconds> [kind]`: the wait (retry-after) and, for OpenAI, the error
        type (rate_limit_exceeded, the default; insufficient_quota; usage_limit_reached,
        ChatGPT plans' shape with resets_in_seconds)."""
        parts = spec.split()
        try:
            wait = int(parts[0])
        except (IndexError, ValueError):
            wait = 60
        kind = parts[1] if len(parts) > 1 else ""
        reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + wait))
        self._log(body, {"kind": "rate-limited", "api": api, "wait": wait, "type": kind or "default"})
        headers = {"retry-after": str(wait)}
        if api == "anthropic":
            headers.update({"anthropic-ratelimit-requests-limit": "50",
                            "anthropic-ratelimit-requests-remaining": "0",
                            "anthropic-ratelimit-requests-reset": reset})
            return self._json(429, {"type": "error", "error": {
                "type": "rate_limit_error",
                "message": "This request would exceed the rate limit for your organization of "
                           "50 requests per minute. For details, refer to "
                           "https://docs.claude.com/en/api/rate-limits."}}, headers)
        if api == "gemini":
            return self._json(429, {"error": {
                "code": 429,
                "message": "You exceeded your current quota, please check your plan and billing "
                           "details. Please retry in %ds." % wait,
                "status": "RESOURCE_EXHAUSTED",
                "details": [
                    {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests_per_minute",
                        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "%ds" % wait}]}},
                headers)
        headers.update({"x-ratelimit-limit-requests": "500",
                        "x-ratelimit-remaining-requests": "0",
                        "x-ratelimit-reset-requests": "%ds" % wait})
        if kind == "usage_limit_reached":
            return self._json(429, {"error": {
                "type": "usage_limit_reached", "message": "The usage limit has been reached",
                "plan_type": "plus", "resets_at": int(time.time()) + wait,
                "resets_in_seconds": wait}}, headers)
        if kind == "insufficient_quota":
            return self._json(429, {"error": {
                "message": "You exceeded your current quota, please check your plan and billing "
                           "details.", "type": "insufficient_quota", "param": None,
                "code": "insufficient_quota"}}, headers)
        return self._json(429, {"error": {
            "message": "Rate limit reached for requests per min (RPM): Limit 500, Used 500, "
                       "Requested 1. Please try again in %ds." % wait,
            "type": "requests", "param": None, "code": "rate_limit_exceeded"}}, headers)

    # -- Anthropic -------------------------------------------------------
    def anthropic(self, body):
        conv = parse_anthropic(body)
        if self._pre(conv, body, "anthropic"):
            return
        act = decide(conv)
        self._log(body, {k: v for k, v in act.items()})
        mid = nid("msg")
        usage = anthropic_usage()
        blocks = []
        if "call" in act:
            c = act["call"]
            blocks.append({"type": "tool_use", "id": nid("toolu"), "name": c["name"],
                           "input": c.get("args") or {}})
            stop = "tool_use"
        else:
            blocks.append({"type": "text", "text": act["text"]})
            stop = "end_turn"
        if not conv.stream:
            return self._json(200, {"id": mid, "type": "message", "role": "assistant",
                                    "model": conv.model, "content": blocks,
                                    "stop_reason": stop, "stop_sequence": None, "usage": usage})
        self._sse_start()
        start_usage = dict(usage, output_tokens=1)
        self._sse({"type": "message_start", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": conv.model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}},
            "message_start")
        for i, b in enumerate(blocks):
            if b["type"] == "text":
                self._sse({"type": "content_block_start", "index": i,
                           "content_block": {"type": "text", "text": ""}}, "content_block_start")
                self._sse({"type": "ping"}, "ping")
                for ch in chunks(b["text"]):
                    self._sse({"type": "content_block_delta", "index": i,
                               "delta": {"type": "text_delta", "text": ch}}, "content_block_delta")
            else:
                self._sse({"type": "content_block_start", "index": i, "content_block": {
                    "type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}},
                    "content_block_start")
                js = json.dumps(b["input"])
                self._sse({"type": "content_block_delta", "index": i,
                           "delta": {"type": "input_json_delta", "partial_json": ""}},
                          "content_block_delta")
                for ch in chunks(js):
                    self._sse({"type": "content_block_delta", "index": i,
                               "delta": {"type": "input_json_delta", "partial_json": ch}},
                              "content_block_delta")
            self._sse({"type": "content_block_stop", "index": i}, "content_block_stop")
        self._sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                   "usage": usage}, "message_delta")
        self._sse({"type": "message_stop"}, "message_stop")

    # -- OpenAI Responses ------------------------------------------------
    def openai_responses(self, body):
        conv = parse_responses(body)
        if self._pre(conv, body, "openai"):
            return
        act = decide(conv)
        self._log(body, act)
        rid = nid("resp")
        pt = openai_prompt_tokens()
        usage = {"input_tokens": pt,
                 "input_tokens_details": {"cached_tokens": USAGE["cache_read"]},
                 "output_tokens": USAGE["output"],
                 "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": pt + USAGE["output"]}
        if "call" in act:
            c = act["call"]
            cid = nid("call")
            if "custom_input" in c:
                item = {"type": "custom_tool_call", "id": nid("ctc"), "call_id": cid,
                        "name": c["name"], "input": c["custom_input"], "status": "completed"}
            elif "local_shell" in c:
                item = {"type": "local_shell_call", "id": nid("lsh"), "call_id": cid,
                        "status": "completed",
                        "action": {"type": "exec", "command": c["local_shell"]}}
            else:
                item = {"type": "function_call", "id": nid("fc"), "call_id": cid,
                        "name": c["name"], "arguments": json.dumps(c["args"]),
                        "status": "completed"}
        else:
            item = {"type": "message", "id": nid("msg"), "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": act["text"], "annotations": []}]}
        resp = {"id": rid, "object": "response", "created_at": int(time.time()),
                "status": "completed", "model": conv.model, "output": [item], "usage": usage}
        if not conv.stream:
            return self._json(200, resp)
        self._sse_start()
        seq = [0]

        def ev(t, d):
            d = dict(d, type=t, sequence_number=seq[0])
            seq[0] += 1
            self._sse(d, t)
        ev("response.created", {"response": dict(resp, status="in_progress", output=[], usage=None)})
        ev("response.in_progress", {"response": dict(resp, status="in_progress", output=[], usage=None)})
        if item["type"] == "message":
            text = act["text"]
            ev("response.output_item.added", {"output_index": 0, "item": dict(
                item, status="in_progress", content=[])})
            ev("response.content_part.added", {"item_id": item["id"], "output_index": 0,
                                               "content_index": 0, "part": {
                                                   "type": "output_text", "text": "", "annotations": []}})
            for ch in chunks(text):
                ev("response.output_text.delta", {"item_id": item["id"], "output_index": 0,
                                                  "content_index": 0, "delta": ch})
            ev("response.output_text.done", {"item_id": item["id"], "output_index": 0,
                                             "content_index": 0, "text": text})
            ev("response.content_part.done", {"item_id": item["id"], "output_index": 0,
                                              "content_index": 0, "part": item["content"][0]})
        else:
            added = dict(item, status="in_progress")
            if item["type"] == "function_call":
                added["arguments"] = ""
            ev("response.output_item.added", {"output_index": 0, "item": added})
            if item["type"] == "function_call":
                ev("response.function_call_arguments.delta", {
                    "item_id": item["id"], "output_index": 0, "delta": item["arguments"]})
                ev("response.function_call_arguments.done", {
                    "item_id": item["id"], "output_index": 0, "arguments": item["arguments"]})
            elif item["type"] == "custom_tool_call":
                ev("response.custom_tool_call_input.delta", {
                    "item_id": item["id"], "output_index": 0, "delta": item["input"]})
                ev("response.custom_tool_call_input.done", {
                    "item_id": item["id"], "output_index": 0, "input": item["input"]})
        ev("response.output_item.done", {"output_index": 0, "item": item})
        ev("response.completed", {"response": resp})

    # -- OpenAI Chat Completions ----------------------------------------
    def chat(self, body):
        conv = parse_chat(body)
        if self._pre(conv, body, "openai"):
            return
        act = decide(conv)
        self._log(body, act)
        cid = nid("chatcmpl")
        created = int(time.time())
        pt = openai_prompt_tokens()
        usage = {"prompt_tokens": pt, "completion_tokens": USAGE["output"],
                 "total_tokens": pt + USAGE["output"],
                 "prompt_tokens_details": {"cached_tokens": USAGE["cache_read"]},
                 "completion_tokens_details": {"reasoning_tokens": 0}}
        if "call" in act:
            c = act["call"]
            args = json.dumps(c.get("args") or {"input": c.get("custom_input", "")})
            tc = {"id": nid("call"), "type": "function",
                  "function": {"name": c["name"], "arguments": args}}
            msg = {"role": "assistant", "content": None, "tool_calls": [tc]}
            finish = "tool_calls"
        else:
            msg = {"role": "assistant", "content": act["text"]}
            finish = "stop"
        if not conv.stream:
            return self._json(200, {"id": cid, "object": "chat.completion", "created": created,
                                    "model": conv.model, "choices": [
                                        {"index": 0, "message": msg, "finish_reason": finish}],
                                    "usage": usage})
        self._sse_start()

        def chunk(delta, finish_reason=None, **kw):
            d = {"id": cid, "object": "chat.completion.chunk", "created": created,
                 "model": conv.model,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
            d.update(kw)
            self._sse(d)
        chunk({"role": "assistant", "content": ""})
        if "call" in act:
            tc = msg["tool_calls"][0]
            chunk({"tool_calls": [{"index": 0, "id": tc["id"], "type": "function",
                                   "function": {"name": tc["function"]["name"], "arguments": ""}}]})
            for ch in chunks(tc["function"]["arguments"]):
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": ch}}]})
        else:
            for ch in chunks(act["text"]):
                chunk({"content": ch})
        chunk({}, finish)
        self._sse({"id": cid, "object": "chat.completion.chunk", "created": created,
                   "model": conv.model, "choices": [], "usage": usage})
        self._sse("[DONE]")

    # -- Gemini ----------------------------------------------------------
    def gemini(self, body, model, method):
        if method == "countTokens":
            self._log(body, {"kind": "countTokens"})
            return self._json(200, {"totalTokens": openai_prompt_tokens()})
        stream = method == "streamGenerateContent"
        conv = parse_gemini(body, stream, model)
        if self._pre(conv, body, "gemini"):
            return
        act = decide(conv)
        self._log(body, act)
        pt = openai_prompt_tokens()
        usage = {"promptTokenCount": pt, "candidatesTokenCount": USAGE["output"],
                 "cachedContentTokenCount": USAGE["cache_read"],
                 "totalTokenCount": pt + USAGE["output"]}
        if "call" in act:
            c = act["call"]
            parts = [{"functionCall": {"name": c["name"],
                                       "args": c.get("args") or {"input": c.get("custom_input")}}}]
        else:
            parts = [{"text": act["text"]}]
        resp = {"candidates": [{"content": {"role": "model", "parts": parts},
                                "finishReason": "STOP", "index": 0}],
                "usageMetadata": usage, "modelVersion": model,
                "responseId": nid("gresp")}
        if not stream:
            return self._json(200, resp)
        self._sse_start()
        if "call" not in act and len(act["text"]) > 40:
            pieces = chunks(act["text"])
            for p in pieces[:-1]:
                self._sse({"candidates": [{"content": {"role": "model", "parts": [{"text": p}]},
                                           "index": 0}], "modelVersion": model})
            resp["candidates"][0]["content"]["parts"] = [{"text": pieces[-1]}]
        self._sse(resp)


def main():
    global LOG_PATH
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--log", default=None, help="append one JSON line per request")
    ap.add_argument("--port-file", default=None, help="write the bound port here")
    a = ap.parse_args()
    LOG_PATH = a.log
    srv = ThreadingHTTPServer((a.host, a.port), Handler)
    srv.daemon_threads = True
    port = srv.server_address[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.replace(tmp, a.port_file)
    print("fake_model_server listening on http://%s:%d" % (a.host, port), file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
