#!/usr/bin/env python3
"""Import circles between the files of a crate (issue 41): file A names an item of file B
(`crate::b::...`, `super::b`, `self::b`) and B, directly or through others, names one of A.
A module and the modules inside it (`x.rs` / `x/mod.rs` and `x/*.rs`) may name each other:
that is one unit. Prints each circle and exits 1 when there is one.

Usage: scripts/import-cycles.py [SRC_DIR...] (default: the crates issue 41 names)."""

import os
import re
import sys

DEFAULT = ["shim/src", "sandbox/src", "factory/src", "hypervisor/src", "vmm/src", "agent/src"]
PATH = re.compile(r"\b(crate|super|self)::((?:\{[^{}]*\}|\w+)(?:::(?:\{[^{}]*\}|\w+))*)")


def modules(src):
    """Module path (tuple) -> file, for every .rs file under src but `tests.rs` files (a
    module's unit tests kept beside it)."""
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs") or f == "tests.rs":
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            mods[tuple(parts)] = os.path.join(root, f)
    return mods


TESTS = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\(\w+\))?\s+)?mod\s+\w+\s*\{")


def production(text):
    """The file without comments and without its unit tests (the `#[cfg(test)] mod`
    block, last in the file by the project's style): what tests name is no import."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    m = TESTS.search(text)
    return text[:m.start()] if m else text


def expand(path):
    """`a::{b, c::d}` -> [[a, b], [a, c, d]] (one level of braces, as `use` lists go)."""
    m = re.match(r"^((?:\w+::)*)\{([^{}]*)\}", path)
    if m:
        head = [p for p in m.group(1).split("::") if p]
        return [head + [p for p in item.strip().split("::") if p]
                for item in m.group(2).split(",") if item.strip()]
    return [[p for p in path.split("::") if p and not p.startswith("{")]]


def resolve(mods, base, names):
    """The longest module prefix of base + names that is a file."""
    full = list(base) + names
    for n in range(len(full), -1, -1):
        if tuple(full[:n]) in mods:
            return tuple(full[:n])
    return None


def unit(a, b):
    """Whether one module is inside the other (or they are the same)."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def edges(mods, src):
    out = {m: set() for m in mods}
    for mod, file in mods.items():
        with open(file, encoding="utf-8") as f:
            text = production(f.read())
        here = mod
        for kind, path in PATH.findall(text):
            for names in expand(path):
                if kind == "crate":
                    base = ()
                elif kind == "self":
                    base = here
                else:  # super: the parent of this module, more for super::super
                    base = here[:-1]
                    while names and names[0] == "super":
                        names = names[1:]
                        base = base[:-1]
                target = resolve(mods, base, names)
                if target is not None and not unit(mod, target):
                    out[mod].add(target)
    return out


def cycles(graph):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
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

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def main(dirs):
    found = 0
    for src in dirs:
        mods = modules(src)
        graph = edges(mods, src)
        for comp in cycles(graph):
            found += 1
            names = ["::".join(m) or "(root)" for m in comp]
            print("%s: import circle: %s" % (src, " <-> ".join(names)))
            for a in comp:
                for b in sorted(graph[a]):
                    if b in comp:
                        print("    %s names %s" % (mods[a], mods[b]))
    if found:
        print("%d import circle(s)" % found)
        return 1
    print("no import circle in %s" % ", ".join(dirs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or DEFAULT))
