"""The package layers, read from the source (ast; nothing is imported): imports point down only.

Layers, bottom up: kernels -> cache -> attention -> model -> checkpoint -> speculative -> worker -> parallel ->
engine -> serve, then graphrt/cli.py. graphrt/config.py is a leaf (imports nothing of graphrt) that any
layer may use; the root package `graphrt` (lazy) may be imported for `__version__` only. Lazy imports
inside functions count like top-level ones. No private name (`_x`) is imported from another
module, and no two modules import each other (directly or around a loop).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "graphrt"
LAYERS = ["kernels", "cache", "attention", "model", "checkpoint", "speculative", "worker", "parallel", "engine",
          "serve", "cli"]
RANK = {name: i for i, name in enumerate(LAYERS)}

# Known violations, each owned by a change in flight (empty: none today). An entry that is no
# longer needed fails the test, so the lists cannot go stale.
ALLOWED_PRIVATE: set = set()
ALLOWED_CYCLES: list = []


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("graphrt",) + path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every graphrt import in the file."""
    is_pkg = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "graphrt"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against the importing package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            if base.split(".")[0] == "graphrt":
                found += [(base, a.name) for a in node.names]
    return found


def _target(module: str, taken: str | None) -> str:
    """The module an import loads: `from graphrt.a import b` is module graphrt.a.b when it exists."""
    sub = f"{module}.{taken}" if taken else None
    return sub if sub in MODULES else module


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "graphrt"


def _edges() -> dict[str, set[str]]:
    edges = defaultdict(set)
    for name, path in MODULES.items():
        for module, taken in _imports(name, path):
            edges[name].add(_target(module, taken))
    return edges


def test_walk_sees_the_tree():
    # the walk itself must be reading the tree (a broken glob would pass every rule below)
    assert {"graphrt.kernels.prepare", "graphrt.attention.runtime", "graphrt.serve.app",
            "graphrt.config", "graphrt.kernels.plan_layout"} <= set(MODULES)
    assert "graphrt.kernels.plan_layout" in _edges()["graphrt.kernels.prepare"]


def test_imports_point_down():
    bad = []
    for name, path in MODULES.items():
        src = _layer(name)
        for module, taken in _imports(name, path):
            dst = _layer(module)
            if dst == "graphrt":  # the root package (lazy: loads nothing): its version string only
                if name != "graphrt" and taken not in (None, "__version__"):
                    bad.append(f"{name} imports {taken!r} from the root package (only __version__)")
            elif dst == "config":
                if src == "config":
                    continue
            elif src == "config":
                bad.append(f"graphrt.config (a leaf) imports {module}")
            elif src == "graphrt":
                bad.append(f"the root package imports {module} eagerly (names resolve lazily)")
            elif dst not in RANK or src not in RANK:
                bad.append(f"{name} -> {module}: a layer this test does not know ({src} / {dst})")
            elif RANK[dst] > RANK[src]:
                bad.append(f"{name} ({src}) imports {module} ({dst}), a higher layer")
    assert not bad, "\n".join(bad)


def test_kernels_import_only_kernels_and_config():
    for name, path in MODULES.items():
        if _layer(name) == "kernels":
            for module, _ in _imports(name, path):
                assert _layer(module) in ("kernels", "config"), f"{name} imports {module}"


def test_no_private_name_crosses_modules():
    bad = set()
    for name, path in MODULES.items():
        for module, taken in _imports(name, path):
            privates = [p for p in ([taken] if taken else module.split("."))
                        if p.startswith("_") and not p.startswith("__")]
            if privates and _target(module, taken) != name:
                bad.add((name, module, privates[0]))
    new = sorted(bad - ALLOWED_PRIVATE)
    assert not new, "private names imported across modules: " + ", ".join(
        f"{a} takes {c} from {b}" for a, b, c in new)
    stale = sorted(ALLOWED_PRIVATE - bad)
    assert not stale, f"allow-list entries no longer needed (remove them): {stale}"


def _cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]; counter[0] += 1
        stack.append(start); on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop(); on.discard(w); comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_cycle_finder_finds_a_loop():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    found = _cycles(_edges())
    new = [c for c in found if c not in ALLOWED_CYCLES]
    assert not new, f"import circles: {[sorted(c) for c in new]}"
    stale = [c for c in ALLOWED_CYCLES if c not in found]
    assert not stale, f"allow-listed circles that are gone (remove them): {[sorted(c) for c in stale]}"


def test_no_test_module_imports_another():
    # shared test code lives in helper modules (tests/_checkpoints.py, tests/_serve_live.py, ...)
    # and fixtures in conftest.py; importing a test_*.py runs its module body twice under two names
    tests = Path(__file__).resolve().parent
    bad = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.relative_to(tests)} imports {n}" for n in names
                    if n.split(".")[-1].startswith(("test_", "conftest"))]
    assert not bad, "\n".join(bad)
