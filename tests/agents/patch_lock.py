#!/usr/bin/env python3
"""Add lock entries for opencode-ai platform packages the registry does not serve.

opencode-ai@1.18.33 lists 12 optionalDependencies; the registry here only has the two
linux-x64 ones at 1.18.33, so `npm install` drops the rest from package-lock.json and
`npm ci` then refuses ("Missing: opencode-darwin-arm64@ from lock file"). Each entry
added here carries os/cpu/libc so npm ci skips it on this platform without fetching.
Run after regenerating the lock with `npm install --package-lock-only`.
"""
import json, sys

PLAT = {
    "darwin-arm64": (["darwin"], ["arm64"], None),
    "darwin-x64": (["darwin"], ["x64"], None),
    "darwin-x64-baseline": (["darwin"], ["x64"], None),
    "linux-arm64": (["linux"], ["arm64"], ["glibc"]),
    "linux-arm64-musl": (["linux"], ["arm64"], ["musl"]),
    "linux-x64-baseline-musl": (["linux"], ["x64"], ["musl"]),
    "linux-x64-musl": (["linux"], ["x64"], ["musl"]),
    "windows-arm64": (["win32"], ["arm64"], None),
    "windows-x64": (["win32"], ["x64"], None),
    "windows-x64-baseline": (["win32"], ["x64"], None),
}
path = sys.argv[1] if len(sys.argv) > 1 else "package-lock.json"
lock = json.load(open(path))
pk = lock["packages"]
ver = pk["node_modules/opencode-ai"]["version"]
for name, (os_, cpu, libc) in PLAT.items():
    key = f"node_modules/opencode-{name}"
    if key in pk:
        continue
    e = {"version": ver, "cpu": cpu, "optional": True, "os": os_}
    if libc:
        e["libc"] = libc
    pk[key] = e
lock["packages"] = dict(sorted(pk.items(), key=lambda kv: kv[0]))
json.dump(lock, open(path, "w"), indent=2)
open(path, "a").write("\n")
print("patched", path)
