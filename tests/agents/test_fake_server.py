#!/usr/bin/env python3
"""Self-test of fake_model_server.py (stdlib only): every endpoint, stream and non-stream,
tool-call and final-answer turns. Usage: python3 test_fake_server.py"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
failures = []
passed = [0]


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else "  " + str(detail)[:300]))
    if not cond:
        failures.append(name)
    else:
        passed[0] += 1


def post(url, body, raw=False):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        data = r.read().decode()
        return data if raw else json.loads(data)


def sse(text):
    """[(event, data-json-or-str)]"""
    out = []
    for block in text.split("\n\n"):
        ev, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is not None:
            try:
                data = json.loads(data)
            except ValueError:
                pass
            out.append((ev, data))
    return out


def main():
    tmp = tempfile.mkdtemp()
    pf, log = os.path.join(tmp, "port"), os.path.join(tmp, "log.jsonl")
    srv = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_model_server.py"),
                            "--port", "0", "--log", log, "--port-file", pf],
                           stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if os.path.exists(pf):
                break
            time.sleep(0.05)
        base = "http://127.0.0.1:%s" % open(pf).read().strip()
        impl = "LOOPFLOW-ROLE: implement\nLOOPFLOW-WRITE: src/a.txt\n"
        ver = "LOOPFLOW-ROLE: verify\nLOOPFLOW-SCORE: 0.5\n"

        # Anthropic
        tools = [{"name": "Write", "input_schema": {"properties": {"file_path": {}, "content": {}}}}]
        ev = sse(post(base + "/v1/messages?beta=true", {"model": "m", "stream": True, "system": "Primary working directory: /w",
                      "messages": [{"role": "user", "content": impl}], "tools": tools}, raw=True))
        names = [e for e, _ in ev]
        check("anthropic stream events", names[0] == "message_start" and names[-1] == "message_stop"
              and "content_block_start" in names and "message_delta" in names, names)
        js = "".join(d["delta"]["partial_json"] for e, d in ev if e == "content_block_delta")
        check("anthropic tool_use Write abs path", json.loads(js)["file_path"] == "/w/src/a.txt", js)
        md = [d for e, d in ev if e == "message_delta"][0]
        check("anthropic usage cache fields", md["usage"]["cache_read_input_tokens"] > 0
              and "cache_creation_input_tokens" in md["usage"], md)
        msgs = [{"role": "user", "content": impl},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Write", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]
        r = post(base + "/v1/messages", {"model": "m", "messages": msgs, "tools": tools})
        check("anthropic non-stream final 'done'", r["content"][0]["text"] == "done", r)
        r = post(base + "/v1/messages", {"model": "m", "messages": [{"role": "user", "content": ver}]})
        check("anthropic verdict fenced json", '"score": 0.5' in r["content"][0]["text"]
              and '"pass": false' in r["content"][0]["text"], r)
        r = post(base + "/v1/messages/count_tokens", {"model": "m", "messages": []})
        check("anthropic count_tokens", r["input_tokens"] > 0, r)

        # OpenAI Responses
        ev = sse(post(base + "/v1/responses", {"model": "m", "stream": True,
                      "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": impl}]}],
                      "tools": [{"type": "custom", "name": "apply_patch"}]}, raw=True))
        names = [e for e, _ in ev]
        check("responses stream events", names[0] == "response.created" and names[-1] == "response.completed"
              and "response.output_item.done" in names, names)
        item = [d for e, d in ev if e == "response.output_item.done"][0]["item"]
        check("responses custom apply_patch", item["type"] == "custom_tool_call"
              and "*** Add File: src/a.txt" in item["input"], item)
        usage = ev[-1][1]["response"]["usage"]
        check("responses cached_tokens", usage["input_tokens_details"]["cached_tokens"] > 0, usage)
        r = post(base + "/v1/responses", {"model": "m", "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": impl}]},
            {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"}],
            "tools": [{"type": "function", "name": "exec_command", "parameters": {"properties": {"cmd": {}}}}]})
        check("responses non-stream final", r["output"][0]["content"][0]["text"] == "done", r)

        # Chat Completions
        ev = sse(post(base + "/v1/chat/completions", {"model": "m", "stream": True,
                      "messages": [{"role": "system", "content": "Working directory: /w"}, {"role": "user", "content": impl}],
                      "tools": [{"type": "function", "function": {"name": "write", "parameters": {
                          "properties": {"filePath": {}, "content": {}}}}}]}, raw=True))
        check("chat stream ends with [DONE]", ev[-1][1] == "[DONE]", ev[-1])
        args = "".join(tc["function"].get("arguments", "") for _, d in ev if isinstance(d, dict) and d.get("choices")
                       for tc in d["choices"][0]["delta"].get("tool_calls", []))
        check("chat tool_calls write filePath", json.loads(args)["filePath"] == "/w/src/a.txt", args)
        usage = [d for _, d in ev if isinstance(d, dict) and d.get("usage")][0]["usage"]
        check("chat usage chunk cached_tokens", usage["prompt_tokens_details"]["cached_tokens"] > 0, usage)
        r = post(base + "/v1/chat/completions", {"model": "m", "messages": [
            {"role": "system", "content": "You are a title generator. You output ONLY a thread title."},
            {"role": "user", "content": impl}]})
        check("chat title request", r["choices"][0]["message"]["content"] == "Loopflow task", r)
        # No tools offered (aider): the file comes back in aider's "whole" edit format.
        r = post(base + "/v1/chat/completions", {"model": "m", "messages": [
            {"role": "user", "content": impl + "LOOPFLOW-CONTENT: hi\n"}]})
        check("chat without tools: whole-file edit", r["choices"][0]["message"]["content"]
              == "src/a.txt\n```\nhi\n```\n", r)
        r = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=5).read())
        check("GET /v1/models", r["data"][0]["id"], r)

        # Gemini
        ev = sse(post(base + "/v1beta/models/g:streamGenerateContent?alt=sse", {
            "contents": [{"role": "user", "parts": [{"text": impl}]}],
            "tools": [{"functionDeclarations": [{"name": "write_file", "parameters": {
                "properties": {"file_path": {}, "content": {}}}}]}]}, raw=True))
        fc = ev[-1][1]["candidates"][0]["content"]["parts"][0]["functionCall"]
        check("gemini functionCall write_file", fc["name"] == "write_file", fc)
        check("gemini usageMetadata cached", ev[-1][1]["usageMetadata"]["cachedContentTokenCount"] > 0, ev[-1][1])
        r = post(base + "/v1beta/models/g:generateContent", {
            "contents": [{"role": "user", "parts": [{"text": "route"}]}],
            "generationConfig": {"responseJsonSchema": {"type": "OBJECT", "properties": {
                "reasoning": {"type": "STRING"}, "model_choice": {"type": "STRING", "enum": ["flash", "pro"]}}}}})
        v = json.loads(r["candidates"][0]["content"]["parts"][0]["text"])
        check("gemini schema answer", v == {"reasoning": "ok", "model_choice": "flash"}, v)
        r = post(base + "/v1beta/models/g:countTokens", {"contents": []})
        check("gemini countTokens", r["totalTokens"] > 0, r)
        lines = open(log).read().splitlines()
        check("request log has one line per request", len(lines) == 13, len(lines))

        # Rate limits: HTTP 429 in each provider's shape, with retry-after.
        def refused(url, body):
            req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=10)
            except urllib.error.HTTPError as e:
                return e.code, e.headers.get("retry-after"), json.loads(e.read().decode())
            return 200, None, None
        limit = "LOOPFLOW-ROLE: implement\nLOOPFLOW-RATE-LIMIT: 3600\n"
        code, after, body = refused(base + "/v1/messages", {"model": "m", "messages": [
            {"role": "user", "content": limit}]})
        check("anthropic 429 rate_limit_error", code == 429 and after == "3600"
              and body["error"]["type"] == "rate_limit_error", (code, after, body))
        code, after, body = refused(base + "/v1/responses", {"model": "m", "input": limit.replace(
            "3600", "60 usage_limit_reached")})
        check("responses 429 usage_limit_reached", code == 429 and after == "60"
              and body["error"]["resets_in_seconds"] == 60, (code, body))
        code, _, body = refused(base + "/v1/chat/completions", {"model": "m", "messages": [
            {"role": "user", "content": limit}]})
        check("chat 429 rate_limit_exceeded", code == 429
              and body["error"]["code"] == "rate_limit_exceeded", (code, body))
        code, _, body = refused(base + "/v1beta/models/g:generateContent", {
            "contents": [{"role": "user", "parts": [{"text": limit}]}]})
        retry = [d for d in body["error"]["details"] if d["@type"].endswith("RetryInfo")]
        check("gemini 429 RESOURCE_EXHAUSTED with RetryInfo", code == 429
              and body["error"]["status"] == "RESOURCE_EXHAUSTED"
              and retry and retry[0]["retryDelay"] == "3600s", (code, body))
    finally:
        srv.terminate()
        srv.wait()
    print("%d passed, %d failed" % (passed[0], len(failures)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
