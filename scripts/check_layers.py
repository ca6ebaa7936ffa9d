#!/usr/bin/env python3
"""Fails (exit 1) on an edge of the layering crossed downwards-up, or any cycle.

Layers (the project's style guide): base <- {formats, kernels, io} <- {synth, linalg} <- runtime <- fitters
<- eval <- cli.

Includes (from the sources): a module may include its own headers, and from a module below
it only the headers in that module's include/ folder (its public API). tests/, tools/ and
fuzz/ may include anything but a .c file. Header include cycles (file level) are refused.

Symbols (with --build DIR, from `nm` of every object file the build compiled from a module's
sources, found through DIR/compile_commands.json): an object may reference a global symbol
defined in its own module or in a module below it, never one defined above it; and the
runtime's sub-modules (runtime/<sub>: model, tokenizer, session, prefill, kv, cache,
generate) reference each other without a cycle. Each problem names the symbols and the
objects that reference them.

Usage: python3 scripts/check_layers.py [--build DIR] [repo root]
"""
import argparse
import json
import os
import re
import subprocess
import sys

_ap = argparse.ArgumentParser(description="layering check: includes, and symbols with --build")
_ap.add_argument("--build", help="a configured and built meson build directory: also check symbols")
_ap.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
ARGS = _ap.parse_args()
ROOT = os.path.abspath(ARGS.root)

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


# the runtime's sub-modules, for the symbol graph (runtime/<sub>/...)
RUNTIME_SUBS = ("model", "tokenizer", "session", "prefill", "kv", "cache", "generate")
# sub-modules whose files the symbol check skips: they build programs, not the library
NOT_LIBRARY = ("tests", "fuzz", "tools")


def sym_module(rel):
    """base, formats, ..., runtime/<sub>, ... for a source file (None outside the modules)."""
    mod = module_of(rel)
    if mod is None or mod in NOT_LIBRARY:
        return None
    if mod == "runtime":
        parts = rel.split("/")
        if len(parts) > 2 and parts[1] in RUNTIME_SUBS:
            return "runtime/" + parts[1]
    return mod


def layer_of(smod):
    return "runtime" if smod.startswith("runtime/") else smod


def nm_symbols(obj):
    """(defined, undefined) global symbol names of one object file."""
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"nm {obj}: {out.stderr.strip()}")
    defined, undefined = set(), set()
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        name, kind = f[0], f[1]
        if kind == "U":
            undefined.add(name)
        elif kind in "TDBRCVWGSI" or kind == "u":
            defined.add(name)  # upper case (and u): global; lower case: file-local
    return defined, undefined


def check_symbols(build):
    """(problems, objects read) of the symbol graph of the objects of `build`."""
    errors = []
    cc_path = os.path.join(build, "compile_commands.json")
    if not os.path.exists(cc_path):
        return [f"symbols: {cc_path} not found (configure and build {build} first)"], 0
    cands = {}  # source rel -> (sym module, [object paths])
    for entry in json.load(open(cc_path)):
        src = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
        rel = os.path.relpath(src, ROOT)
        out = entry.get("output")
        smod = sym_module(rel) if out and not rel.startswith("..") else None
        if smod is None:
            continue
        # a source compiled into a test or fuzz target again (e.g. ../../cli/args.c) is the
        # same code: one object per source is enough
        cands.setdefault(rel, (smod, []))[1].append(os.path.normpath(os.path.join(entry["directory"], out)))
    objs = {}  # object path -> (source rel, sym module)
    for rel, (smod, paths) in sorted(cands.items()):
        have = [o for o in paths if os.path.exists(o)]
        if not have:
            errors.append(f"symbols: no object file of {rel} in {build} (build it first)")
            continue
        objs[have[0]] = (rel, smod)
    defs = {}  # symbol -> sym module defining it
    refs = []  # (object rel, sym module, symbol)
    for obj, (rel, smod) in sorted(objs.items()):
        d, u = nm_symbols(obj)
        for name in d:
            defs.setdefault(name, smod)
        refs.extend((rel, smod, name) for name in u)
    edges = {}  # (from, to) -> {symbol: [object rels]}
    for rel, smod, name in refs:
        tgt = defs.get(name)
        if tgt is None or tgt == smod:
            continue  # the C library, a system library, or its own module
        edges.setdefault((smod, tgt), {}).setdefault(name, []).append(rel)

    def show(uses, limit=4):
        items = sorted(uses.items())
        txt = "; ".join(f"{n} ({', '.join(sorted(set(r))[:2])})" for n, r in items[:limit])
        return txt + (f"; and {len(items) - limit} more" if len(items) > limit else "")

    for (a, b), uses in sorted(edges.items()):
        la, lb = layer_of(a), layer_of(b)
        if la != lb and lb not in ALLOWED.get(la, set()):
            errors.append(f"symbols: {a} -> {b} is not an edge of the layering: {show(uses)}")
    # cycles among the runtime's sub-modules (strongly connected components, Tarjan)
    subs = sorted({m for e in edges for m in e if m.startswith("runtime/")})
    graph = {m: sorted({b for (a, b) in edges if a == m and b.startswith("runtime/")}) for m in subs}
    index, low, stack, on, comps = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in subs:
        if v not in index:
            strong(v)
    for comp in comps:
        errors.append(f"symbols: the runtime sub-modules {', '.join(comp)} reference each other in a cycle:")
        for a in comp:
            for b in comp:
                if (a, b) in edges:
                    errors.append(f"symbols:   {a} -> {b}: {show(edges[(a, b)])}")
    if not objs:
        errors.append(f"symbols: no object files of the modules found through {cc_path}")
    return errors, len(objs)


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
    n_objs = 0
    if ARGS.build:
        sym_errors, n_objs = check_symbols(ARGS.build)
        errors += sym_errors
    for e in errors:
        print("layers: " + e, file=sys.stderr)
    what = f"{len(files)} files" + (f", {n_objs} objects" if ARGS.build else "")
    if errors:
        print(f"layers: {len(errors)} problem line(s) ({what})", file=sys.stderr)
        return 1
    print(f"layers: ok ({what}, {len(MODULES)} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
