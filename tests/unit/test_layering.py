"""Import direction and cycles across lifeboat_cache, read from the source with `ast` (nothing imported).

Layers, lowest first; a module imports only modules of its own layer or of lower ones:

    core          config (+ config_values, config_tiers, settings), keys, codec (+ payload_codecs), sealing,
                  index (+ index_*), metrics, io_workers, cooldown, tracing, envvars, background
    tiers         tiers/*
    store         store (+ store_write, store_read, store_calls, store_pages, store_maint), copier, statsfile,
                  prometheus, purge, the package root (its lazy re-exports)
    runtimes      runtimes/*
    integrations  integrations/*
    apps          bench/*, cli, env_table, demo/*, testing/*  (may import anything)

Every import counts: one inside a function (it runs when called), and one under `if TYPE_CHECKING:`
(never executed, but a reader and a type checker follow it; a circle that exists only for type hints is
still two modules that cannot be understood apart). A failure names the importing file and line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PKG = "lifeboat_cache"
ROOT = Path(__file__).resolve().parents[2] / PKG

LAYERS = ["core", "tiers", "store", "runtimes", "integrations", "apps"]
CORE = {"config", "config_values", "config_tiers", "settings", "keys", "codec", "payload_codecs", "sealing", "index",
        "index_order", "index_arena", "index_deltas", "index_main", "metrics", "io_workers", "cooldown", "tracing",
        "envvars", "background"}
STORE = {"", "store", "store_write", "store_read", "store_calls", "store_pages", "store_maint", "copier", "statsfile",
         "prometheus", "purge"}
APPS = {"bench", "cli", "demo", "testing", "env_table"}


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.src} imports {self.dst}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    rel = module[len(PKG) + 1:] if module != PKG else ""
    top = rel.split(".", 1)[0]
    if rel in CORE:
        return "core"
    if rel in STORE:
        return "store"
    if top in ("tiers", "runtimes", "integrations"):
        return top
    if top in APPS:
        return "apps"
    raise AssertionError(f"{module}: not in any layer; add it to tests/unit/test_layering.py (and docs/architecture.md)")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def edges(modules: dict[str, Path], base: Path = ROOT.parent) -> list[Edge]:
    """Every import from one module of `modules` to another (file names relative to base)."""
    out = []
    for mod, path in sorted(modules.items()):
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        rel_file = str(path.relative_to(base))
        for node in sorted(_imports(ast.parse(path.read_text(), rel_file)), key=lambda n: n.lineno):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    target = ".".join(up + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # `from . import x` imports the submodule x when there is one, else a name of the package
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
            for t in targets:
                while t and t not in modules and "." in t:  # `import a.b.c` of a name: its module
                    t = t.rsplit(".", 1)[0]
                if t in modules and t != mod:
                    out.append(Edge(mod, t, rel_file, node.lineno))
    return out


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def cycles(graph: list[Edge]) -> list[list[Edge]]:
    """One cycle (as its edges) per strongly connected component with more than one module."""
    adj: dict[str, list[Edge]] = {}
    for e in graph:
        adj.setdefault(e.src, []).append(e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []

    def strong(v: str) -> None:  # Tarjan; the module graph is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for e in adj.get(v, []):
            if e.dst not in index:
                strong(e.dst)
                low[v] = min(low[v], low[e.dst])
            elif e.dst in on:
                low[v] = min(low[v], index[e.dst])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted({e.src for e in graph}):
        if v not in index:
            strong(v)
    found = []
    for comp in comps:  # walk inside the component from its first module back to it
        start = min(comp)
        path: list[Edge] = []
        seen = {start}
        v = start
        while True:
            nxt = [e for e in adj[v] if e.dst in comp]
            back = [e for e in nxt if e.dst == start]
            e = back[0] if back else next((e for e in nxt if e.dst not in seen), nxt[0])
            path.append(e)
            if e.dst == start or e.dst in seen:
                break
            seen.add(e.dst)
            v = e.dst
        found.append(path)
    return found


def test_every_module_has_a_layer() -> None:
    for mod in all_modules():
        layer_of(mod)


def test_imports_point_down_the_layers() -> None:
    bad = [f"{e} ({layer_of(e.src)} may not import {layer_of(e.dst)})" for e in edges(all_modules())
           if LAYERS.index(layer_of(e.dst)) > LAYERS.index(layer_of(e.src))]
    assert not bad, "imports against the layering (core <- tiers <- store <- runtimes <- integrations <- apps):\n" \
        + "\n".join(bad)


def test_no_import_cycles() -> None:
    found = cycles(edges(all_modules()))
    assert not found, "import cycles:\n" + "\n".join(
        "  cycle:\n" + "\n".join(f"    {e}" for e in c) for c in found)


def test_the_checker_sees_a_violation_and_a_cycle(tmp_path: Path) -> None:
    """The checks above can fail: a core module importing the store (inside a function), and two
    modules importing each other, one of them under TYPE_CHECKING."""
    (tmp_path / PKG).mkdir()
    mods = {f"{PKG}.config": tmp_path / PKG / "config.py", f"{PKG}.store": tmp_path / PKG / "store.py"}
    mods[f"{PKG}.config"].write_text("import os\n\n\ndef f():\n    from .store import ChunkStore\n")
    mods[f"{PKG}.store"].write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                    "    from .config import Settings\n")
    got = edges(mods, tmp_path)
    assert [str(e) for e in got] == [f"{PKG}/config.py:5: {PKG}.config imports {PKG}.store",
                                     f"{PKG}/store.py:4: {PKG}.store imports {PKG}.config"]
    assert LAYERS.index(layer_of(got[0].dst)) > LAYERS.index(layer_of(got[0].src))
    assert [[e.src for e in c] for c in cycles(got)] == [[f"{PKG}.config", f"{PKG}.store"]]
