#!/usr/bin/env python3
"""Runs a generated GitHub Actions workflow's job the way a runner would, offline: each
step in order, its `if:` and `${{ }}` expressions evaluated, `run:` scripts through
`bash --noprofile --norc -eo pipefail`, $GITHUB_OUTPUT and $GITHUB_PATH honoured.

    run_workflow.py WORKFLOW --workspace DIR --event schedule|workflow_dispatch
                    [--inputs JSON] [--token T] [--actor A] [--checkout URL]

`uses: actions/checkout@…` clones --checkout into the workspace (shallow, as the action
does, with the token only for that command when persist-credentials is false); any other
`uses:` step fails the run (the workflow under test must install loopflow with a run:
step, e.g. --binary-url file://…). Prints one JSON document: each step's name, whether it
ran, its exit code and outputs, and the seconds it took."""
import argparse, base64, json, os, re, subprocess, sys, tempfile, time

import yaml


def lookup(ctx, path):
    cur = ctx
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return ""
    return cur


TOKEN = re.compile(r"\s*(\|\||&&|==|!=|!|\(|\)|'(?:[^']|'')*'|[A-Za-z_][A-Za-z0-9_.-]*|-?\d+)")


def evaluate(expr, ctx):
    """The subset of GitHub's expression language the generated workflows use."""
    out, pos = [], 0
    expr = expr.strip()
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read {expr!r} at {pos}")
        t = m.group(1)
        pos = m.end()
        if t == "&&":
            out.append(" and ")
        elif t == "||":
            out.append(" or ")
        elif t == "!":
            out.append(" not ")
        elif t in ("==", "!=", "(", ")"):
            out.append(f" {t} ")
        elif t.startswith("'"):
            out.append(repr(t[1:-1].replace("''", "'")))
        elif t in ("true", "false"):
            out.append(str(t == "true"))
        elif re.fullmatch(r"-?\d+", t):
            out.append(t)
        else:
            out.append(f"lookup(ctx, {t!r})")
    return eval("".join(out), {"lookup": lookup, "ctx": ctx})


def render(text, ctx):
    def one(m):
        v = evaluate(m.group(1), ctx)
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v)

    return re.sub(r"\$\{\{(.*?)\}\}", one, str(text))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("workflow")
    p.add_argument("--workspace", required=True)
    p.add_argument("--event", required=True)
    p.add_argument("--inputs", default="{}")
    p.add_argument("--token", default="")
    p.add_argument("--actor", default="octocat")
    p.add_argument("--checkout", required=True)
    a = p.parse_args()
    wf = yaml.safe_load(open(a.workflow))
    job = next(iter(wf["jobs"].values()))
    inputs = json.loads(a.inputs)
    # Every declared input gets its default, as GitHub fills them.
    declared = (wf.get(True) or wf.get("on") or {}).get("workflow_dispatch", {}) or {}
    for name, spec in (declared.get("inputs") or {}).items():
        if name not in inputs:
            inputs[name] = spec.get("default", "") if a.event == "workflow_dispatch" else ""
    ctx = {
        "github": {"event_name": a.event, "token": a.token, "actor": a.actor},
        "inputs": inputs,
        "secrets": {},
        "steps": {},
        "runner": {"os": "Linux"},
    }
    tmp = tempfile.mkdtemp()
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    path_file = os.path.join(tmp, "github_path")
    open(path_file, "w").close()
    base_env = {
        "PATH": os.environ["PATH"],
        "HOME": home,
        "GITHUB_WORKSPACE": a.workspace,
        "GITHUB_PATH": path_file,
        "GITHUB_EVENT_NAME": a.event,
        "RUNNER_TEMP": tmp,
        "RUNNER_OS": "Linux",
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITHUB_RUN_ID": str(int(time.time())),
        "GITHUB_RUN_ATTEMPT": "1",
    }
    report = []
    failed = False
    for i, step in enumerate(job["steps"]):
        name = step.get("name") or step.get("uses") or f"step {i}"
        cond = step.get("if")
        ok = (not failed) and (cond is None or bool(evaluate(str(cond).replace("${{", "").replace("}}", ""), ctx)))
        entry = {"name": name, "ran": ok, "code": None, "outputs": {}, "seconds": 0.0}
        report.append(entry)
        if not ok:
            continue
        start = time.monotonic()
        if "uses" in step:
            if not step["uses"].startswith("actions/checkout@"):
                entry["code"] = 1
                entry["error"] = f"cannot run {step['uses']} offline"
                failed = True
                continue
            with_ = step.get("with") or {}
            cmd = ["git"]
            if a.token:
                h = base64.b64encode(("x-access-token:" + a.token).encode()).decode()
                cmd += ["-c", f"http.extraHeader=Authorization: Basic {h}"]
            cmd += ["clone", "-q", "--depth", str(with_.get("fetch-depth", 1)), a.checkout, a.workspace]
            entry["code"] = subprocess.run(cmd, stdout=sys.stderr).returncode
            if with_.get("persist-credentials", True) is not False and a.token:
                # What the action does unless told not to.
                subprocess.run(["git", "-C", a.workspace, "config", "http.https://github.com/.extraheader", "AUTHORIZATION: basic " + h])
        else:
            out_file = os.path.join(tmp, f"output-{i}")
            open(out_file, "w").close()
            env = dict(base_env)
            extra = [l for l in open(path_file).read().splitlines() if l]
            env["PATH"] = ":".join(list(reversed(extra)) + [base_env["PATH"]])
            env["GITHUB_OUTPUT"] = out_file
            for k, v in (step.get("env") or {}).items():
                env[k] = render(v, ctx)
            script = render(step["run"], ctx)
            r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=a.workspace, env=env, stdout=sys.stderr)
            entry["code"] = r.returncode
            for line in open(out_file).read().splitlines():
                k, _, v = line.partition("=")
                entry["outputs"][k] = v
            if step.get("id"):
                ctx["steps"][step["id"]] = {"outputs": entry["outputs"]}
        entry["seconds"] = round(time.monotonic() - start, 3)
        if entry["code"] != 0:
            failed = True
    json.dump({"steps": report, "failed": failed}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
