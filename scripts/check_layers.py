#!/usr/bin/env python3
"""Fails (exit 1) on an include across a forbidden edge of the layering, or any cycle.

Layers (STYLE.md, issue 8): base <- {formats, kernels, io} <- linalg <- runtime <- fitters
<- eval <- cli. A module may include its own headers, and from a module below it only the
headers in that module's include/ folder (its public API). tests/ and fuzz/ may include
anything but a .c file. Header include cycles (file level) are refused everywhere.

Usage: python3 scripts/check_layers.py [repo root]
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))

# module -> folder (relative); the first matching prefix wins, longest first
MODULES = {
    "base": "base",
    "linalg": "runtime/linalg",
    "runtime": "runtime",
    "formats": "formats",
    "kernels": "kernels",
    "io": "io",
    "synth": "synth",
    "fitters": "fitters",
    "eval": "eval",
    "cli": "cli",
    "tools": "tools",
    "tests": "tests",
    "fuzz": "fuzz",
}
# what each module may include (besides itself)
ALLOWED = {
    "base": set(),
    "formats": {"base"},
    "kernels": {"base"},
    "io": {"base"},
    "synth": {"base", "formats", "io"},
    "linalg": {"base", "kernels"},
    "runtime": {"base", "formats", "kernels", "io", "linalg"},
    "fitters": {"base", "formats", "kernels", "io", "linalg", "runtime"},
    "eval": {"base", "formats", "kernels", "io", "runtime", "fitters"},
    "cli": {"base", "formats", "kernels", "io", "synth", "runtime", "fitters", "eval"},
}
SKIP_DIRS = {".git", "build", "build-asan", "subprojects"}
INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def module_of(rel):
    best = None
    for mod, folder in MODULES.items():
        if rel == folder or rel.startswith(folder + "/"):
            if best is None or len(folder) > len(MODULES[best]):
                best = mod
    return best


def sources():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build")]
        for f in filenames:
            if f.endswith((".c", ".h", ".cu", ".cuh")):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT)
                if module_of(rel):
                    yield rel


def main():
    files = sorted(sources())
    by_name = {}
    for rel in files:
        by_name.setdefault(os.path.basename(rel), []).append(rel)
    errors = []
    for name, rels in by_name.items():
        hdrs = [r for r in rels if r.endswith((".h", ".cuh")) and module_of(r) not in ("tests", "fuzz")]
        if len(hdrs) > 1:
            errors.append(f"header name {name} is used twice ({', '.join(hdrs)}): includes would be ambiguous")
    graph = {}
    for rel in files:
        mod = module_of(rel)
        text = open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace").read()
        deps = []
        for inc in INC.findall(text):
            base = os.path.basename(inc)
            if base.endswith(".c"):
                errors.append(f"{rel}: includes a .c file ({inc})")
                continue
            # same folder first (the compiler's rule for quoted includes), then by name
            local = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
            targets = [local] if local in files else [r for r in by_name.get(base, []) if module_of(r) not in ("tests", "fuzz") or module_of(r) == mod]
            if not targets:
                continue  # a system or generated header
            tgt = targets[0]
            deps.append(tgt)
            tmod = module_of(tgt)
            if mod in ("tests", "fuzz", "tools") or tmod == mod:
                continue
            if tmod not in ALLOWED.get(mod, set()):
                errors.append(f"{rel}: includes {tgt} ({mod} -> {tmod} is not an edge of the layering)")
            elif "/include/" not in "/" + tgt:
                errors.append(f"{rel}: includes {tgt}, an internal header of {tmod} (only {tmod}'s include/ is exported)")
        graph[rel] = deps
    # header-level include cycles
    state = {}
    def visit(f, stack):
        state[f] = 1
        stack.append(f)
        for g in graph.get(f, []):
            if state.get(g) == 1:
                cyc = stack[stack.index(g):] + [g]
                errors.append("include cycle: " + " -> ".join(cyc))
            elif g not in state:
                visit(g, stack)
        stack.pop()
        state[f] = 2
    for f in files:
        if f not in state:
            visit(f, [])
    for e in errors:
        print("layers: " + e, file=sys.stderr)
    if errors:
        print(f"layers: {len(errors)} problem(s) in {len(files)} files", file=sys.stderr)
        return 1
    print(f"layers: ok ({len(files)} files, {len(MODULES)} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
