#!/usr/bin/env python3
"""Module dependency report for src/: edges between top-level modules (from `crate::X`
paths outside #[cfg(test)] blocks), the cycles among them, and non-test line counts.
Also: no module the executor reaches imports the notifier, the schedulers or `announce`.
Usage: scripts/modgraph.py [--max-lines N]   (exit 1 on a cycle, an oversized file or an
effect in the walk)"""
import os, re, sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
max_lines = 700
if "--max-lines" in sys.argv:
    max_lines = int(sys.argv[sys.argv.index("--max-lines") + 1])

def strip_tests(text):
    """Drops `#[cfg(test)]` items (a mod block or a single item) and comments."""
    out, i = [], 0
    lines = text.split("\n")
    while i < len(lines):
        if lines[i].strip().startswith("#[cfg(test)]") or lines[i].strip().startswith("#[cfg(all(test"):
            # skip the next item: up to the matching closing brace at the same indent
            j = i + 1
            depth = 0
            started = False
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                if "{" in lines[j]:
                    started = True
                if started and depth <= 0:
                    break
                if not started and lines[j].rstrip().endswith(";"):
                    break
                j += 1
            i = j + 1
            continue
        l = lines[i]
        if l.strip().startswith("//"):
            i += 1
            continue
        out.append(l)
        i += 1
    return out

def module_of(path):
    rel = os.path.relpath(path, SRC)
    parts = rel.split(os.sep)
    if parts[0] in ("lib.rs", "main.rs"):
        return None
    return parts[0][:-3] if parts[0].endswith(".rs") else parts[0]

edges, sizes = {}, {}
for root, _, files in os.walk(SRC):
    for f in files:
        if not f.endswith(".rs"):
            continue
        p = os.path.join(root, f)
        body = strip_tests(open(p, encoding="utf-8").read())
        sizes[os.path.relpath(p, SRC)] = len(body)
        m = module_of(p)
        if m is None:
            continue
        for l in body:
            for dep in re.findall(r"crate::([a-z_]+)", l):
                if dep != m:
                    edges.setdefault(m, set()).add(dep)
            # `use super::…` inside a module dir stays inside it.
mods = sorted(set(edges) | {d for ds in edges.values() for d in ds})
# Tarjan SCC
index, low, onstack, stack, sccs, counter = {}, {}, set(), [], [], [0]
def strong(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); onstack.add(v)
    for w in edges.get(v, ()):
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in onstack:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); onstack.discard(w); comp.append(w)
            if w == v: break
        sccs.append(comp)
sys.setrecursionlimit(10000)
for v in mods:
    if v not in index:
        strong(v)
cycles = [sorted(c) for c in sccs if len(c) > 1]
bad = False
for m in mods:
    print(f"{m:14} -> {', '.join(sorted(edges.get(m, ())))}")
if cycles:
    bad = True
    for c in cycles:
        print("CYCLE:", " <-> ".join(c))
else:
    print("no cycles between modules")
# The walk computes, its driver acts: nothing the executor reaches runs a scheduler or a
# notifier (the tick's driver does, after the walk, through `announce`).
reach, todo = set(), ["exec"]
while todo:
    v = todo.pop()
    if v not in reach:
        reach.add(v)
        todo.extend(edges.get(v, ()))
for acting in ("notify", "schedule", "announce"):
    if acting in reach:
        bad = True
        print(f"EFFECT IN THE WALK: the executor reaches `{acting}`")
big = [(f, n) for f, n in sizes.items() if n > max_lines]
for f, n in sorted(big, key=lambda x: -x[1]):
    bad = True
    print(f"TOO LONG: src/{f}: {n} non-test lines (max {max_lines})")
print("largest:", ", ".join(f"{f} {n}" for f, n in sorted(sizes.items(), key=lambda x: -x[1])[:6]))
sys.exit(1 if bad else 0)
