#!/usr/bin/env python3
"""A smart-HTTP git remote for tests: `git http-backend` (CGI) behind Python's own HTTP
server on 127.0.0.1, with the faults a real remote has, injected on request.

    git_http.py --root DIR --port-file FILE [--token T] [--control FILE]

Serves every bare repository under DIR (GIT_HTTP_EXPORT_ALL), pushes included. With
--token, every request must carry `Authorization: Basic base64(x-access-token:T)` (else
401). The control file (JSON, re-read on every request) injects faults into the pushes
(`git-receive-pack` POSTs) it counts:

    {"fail_pushes": N, "status": 503}   the next N pushes get that status, unapplied
    {"drop_pushes": N}                  the next N pushes are applied, their answers lost
    {"hold_pushes": N, "release": F}    the next N pushes wait (unapplied) until file F
                                        exists; "held" names a file touched meanwhile;
                                        with "then": "fail" they then get 503, unapplied
    {"pass_pushes": N, ...}             the next N pushes pass untouched first
    {"fail_all": 503}                   every request gets that status

Each fault it applies is appended to FILE.log (one line each), and every request's
Authorization header is recorded in FILE.auth, so a test sees what reached the server.
Stops by itself after --lifetime seconds (default 600)."""
import argparse, base64, json, os, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = None
lock = threading.Lock()


def control():
    if not args.control or not os.path.exists(args.control):
        return {}
    try:
        with open(args.control) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def take(kind):
    """Consumes one fault of `kind` from the control file; its settings, or None."""
    with lock:
        c = control()
        n = c.get(kind, 0)
        if n <= 0:
            return None
        c[kind] = n - 1
        with open(args.control + ".tmp", "w") as f:
            json.dump(c, f)
        os.replace(args.control + ".tmp", args.control)
        with open(args.control + ".log", "a") as f:
            f.write(kind + "\n")
        return c


def backend():
    exec_path = subprocess.run(["git", "--exec-path"], capture_output=True, text=True).stdout.strip()
    return os.path.join(exec_path, "git-http-backend")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def reply(self, status, text=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def handle_git(self):
        data = self.body() if self.command == "POST" else b""
        if args.control and args.control:
            with open(args.control + ".auth", "a") as f:
                f.write((self.headers.get("Authorization") or "-") + "\n")
        c = control()
        if c.get("fail_all"):
            return self.reply(int(c["fail_all"]), b"unavailable\n")
        if args.token:
            want = "Basic " + base64.b64encode(("x-access-token:" + args.token).encode()).decode()
            if self.headers.get("Authorization") != want:
                return self.reply(401, b"auth\n", [("WWW-Authenticate", 'Basic realm="git"')])
        push = self.command == "POST" and self.path.split("?")[0].endswith("/git-receive-pack")
        drop = False
        if push and take("pass_pushes") is None:
            f = take("fail_pushes")
            if f is not None:
                return self.reply(int(f.get("status", 503)), b"unavailable\n")
            h = take("hold_pushes")
            if h is not None:
                if h.get("held"):
                    open(h["held"], "a").close()
                while not os.path.exists(h["release"]):
                    time.sleep(0.02)
                if h.get("then") == "fail":
                    return self.reply(503, b"unavailable\n")
            drop = take("drop_pushes") is not None
        path, _, query = self.path.partition("?")
        env = {
            "PATH": os.environ.get("PATH", ""),
            "GIT_PROJECT_ROOT": args.root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(data)),
            "REMOTE_USER": "tester",
            "REMOTE_ADDR": "127.0.0.1",
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
        }
        if self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        out = subprocess.run([backend()], input=data, env=env, capture_output=True).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        if not rest and b"\n\n" in out:
            head, _, rest = out.partition(b"\n\n")
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            k, _, v = line.partition(":")
            if k.lower() == "status":
                status = int(v.strip().split()[0])
            elif k:
                headers.append((k, v.strip()))
        if drop:
            # Applied, but the answer never arrives: the connection just ends.
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return
        self.reply(status, rest, headers)

    do_GET = handle_git
    do_POST = handle_git


def main():
    global args
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--token")
    p.add_argument("--control")
    p.add_argument("--lifetime", type=float, default=600)
    args = p.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.replace(args.port_file + ".tmp", args.port_file)
    threading.Timer(args.lifetime, lambda: os._exit(0)).start()
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
