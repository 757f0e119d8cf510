"""The package's architecture, read from the source with `ast` (nothing imported).

A module's layer is its top-level folder; the modules at the package's top level are the ground floor
(small utilities that import nothing else of the package). Lowest first:

    ground        fsio, cooldown, metrics, background, tracing, cpu_policy (lifeboat_cache/*.py)
    core          config/, records/, index/, retention/
    tiers         tiers/
    store         store/
    ops           ops/
    runtimes      runtimes/
    integrations  integrations/
    apps          bench/, cli/, demo/, testing/, and the package's lazy root (lifeboat_cache/__init__.py)

A new module in an existing folder needs no edit here; a new top-level folder gets a layer below.

Rules, each a test:
- imports point down the layers, and no two modules import each other, directly or around a loop;
- a folder is entered through its face (its `__init__`): a module outside a folder imports the face,
  never a module inside it (`integrations/` and `runtimes/` are the exceptions: their faces import
  nothing so that SGLang's plugin stays cheap, and SGLang loads `integrations/sglang_backend.py` and
  `integrations/sglang_plugin.py` by name);
- no import runs back up: a module never imports a module of a folder that encloses it, except that
  folder's `base` (the contract every implementation in it follows: tiers/base.py);
- faces only re-export: a face imports its folder's names and lists them in `__all__`, and a module
  that is not a face re-exports nothing (every package name it imports, it uses).

Every import counts: one inside a function (it runs when called), and one under `if TYPE_CHECKING:`
(never executed, but a reader and a type checker follow it). A failure names the file and line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PKG = "lifeboat_cache"
ROOT = Path(__file__).resolve().parents[3] / PKG

LAYERS = ["ground", "core", "tiers", "store", "ops", "runtimes", "integrations", "apps"]
FOLDER_LAYER = {"config": "core", "records": "core", "index": "core", "retention": "core", "tiers": "tiers", "store": "store",
                "ops": "ops", "runtimes": "runtimes", "integrations": "integrations",
                "bench": "apps", "cli": "apps", "demo": "apps", "testing": "apps"}
LAZY_FACES = {f"{PKG}.integrations", f"{PKG}.runtimes"}  # import nothing: a plugin must stay cheap
CONTRACT = "base"  # the one module of an enclosing folder that a module below it may import


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.src} imports {self.dst}"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str, faces: set[str] | frozenset[str] = frozenset()) -> str:
    """The layer of a module: its top-level folder's; a module at the top level is the ground floor."""
    rel = module.split(".")[1:]
    if not rel:
        return "apps"  # the root's lazy re-exports (ChunkStore, load_settings, ...)
    top = rel[0]
    if len(rel) == 1 and module not in faces and top not in FOLDER_LAYER:
        return "ground"
    if top not in FOLDER_LAYER:
        raise AssertionError(f"{module}: folder {top}/ has no layer; give it one in tests/unit/architecture/test_layering.py "
                             f"(FOLDER_LAYER) and in docs/architecture.md")
    return FOLDER_LAYER[top]


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


def all_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py")) if p.name != "__main__.py"}


def faces_of(modules: dict[str, Path]) -> set[str]:
    return {m for m, p in modules.items() if p.name == "__init__.py"}


def folder_of(module: str, faces: set[str]) -> str:
    """The folder a module lives in (a face's folder is the face itself)."""
    return module if module in faces else module.rsplit(".", 1)[0]


def inside(module: str, folder: str) -> bool:
    return module == folder or module.startswith(folder + ".")


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


def against_layers(graph: list[Edge], faces: set[str]) -> list[str]:
    return [f"{e} ({layer_of(e.src, faces)} may not import {layer_of(e.dst, faces)})" for e in graph
            if LAYERS.index(layer_of(e.dst, faces)) > LAYERS.index(layer_of(e.src, faces))]


def past_faces(graph: list[Edge], faces: set[str]) -> list[str]:
    """Imports that enter a folder other than through its face."""
    bad = []
    for e in graph:
        folder = folder_of(e.dst, faces)
        if e.dst in faces or folder == PKG or folder in LAZY_FACES or inside(e.src, folder):
            continue
        bad.append(f"{e} (import `{folder}`, its face)")
    return bad


def back_up(graph: list[Edge], faces: set[str]) -> list[str]:
    """Imports of a module of a folder that encloses the importer (other than that folder's contract)."""
    bad = []
    for e in graph:
        own = folder_of(e.src, faces)
        folder = folder_of(e.dst, faces)
        if folder == PKG or folder == own or not inside(own, folder):
            continue
        if e.dst == f"{folder}.{CONTRACT}":
            continue
        bad.append(f"{e} (runs back up into {folder})")
    return bad


def re_exports(modules: dict[str, Path], faces: set[str], base: Path = ROOT.parent) -> list[str]:
    """Package names a non-face module imports but never uses, or lists in `__all__` without defining."""
    bad = []
    for mod, path in sorted(modules.items()):
        if mod in faces:
            continue
        text = path.read_text()
        tree = ast.parse(text)
        imported: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PKG)):
                for a in node.names:
                    imported[a.asname or a.name] = node.lineno
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
        docstrings = {id(d) for d in _docstrings(tree)}
        words = set(" ".join(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                             and isinstance(n.value, str) and id(n) not in docstrings).split())
        for name, line in sorted(imported.items()):
            if name not in used and name not in words:  # a quoted annotation is a use
                bad.append(f"{path.relative_to(base)}:{line}: imports {name} and never uses it (a re-export?)")
        own = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
               for t in ast.walk(n.targets[0] if isinstance(n, ast.Assign) else n.target) if isinstance(t, ast.Name)}
        own |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        for n in tree.body:
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets):
                for elt in getattr(n.value, "elts", []):
                    if isinstance(elt, ast.Constant) and elt.value not in own:
                        bad.append(f"{path.relative_to(base)}:{n.lineno}: __all__ lists {elt.value}, "
                                   f"defined elsewhere (re-export it from a face)")
    return bad


def _docstrings(tree: ast.Module) -> list[ast.AST]:
    out = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.append(body[0].value)
    return out


def face_problems(modules: dict[str, Path], faces: set[str], base: Path = ROOT.parent) -> list[str]:
    """A face holds a docstring, imports of its folder's names and `__all__` (of exactly those names)."""
    bad = []
    for mod in sorted(faces):
        path = modules[mod]
        rel = path.relative_to(base)
        tree = ast.parse(path.read_text())
        if ast.get_docstring(tree) is None:
            bad.append(f"{rel}: a face says what its folder holds (a docstring)")
        if mod == PKG or mod in LAZY_FACES:
            continue
        bound: set[str] = set()
        listed: list[str] | None = None
        for n in tree.body:
            if isinstance(n, ast.ImportFrom) and n.module == "__future__":
                continue
            if isinstance(n, ast.ImportFrom):
                if n.level != 1:
                    bad.append(f"{rel}:{n.lineno}: a face imports only its own folder's modules")
                bound |= {a.asname or a.name for a in n.names}
            elif isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__all__"]:
                listed = [e.value for e in n.value.elts]
            elif not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) and \
                    not isinstance(n, ast.Import):
                bad.append(f"{rel}:{n.lineno}: a face holds no code (move it into a module of the folder)")
        if listed is None or sorted(listed) != sorted(bound):
            bad.append(f"{rel}: __all__ must list exactly the names the face imports")
    return bad


def test_every_module_has_a_layer() -> None:
    modules = all_modules()
    for mod in modules:
        layer_of(mod, faces_of(modules))


def test_imports_point_down_the_layers() -> None:
    modules = all_modules()
    bad = against_layers(edges(modules), faces_of(modules))
    assert not bad, "imports against the layering (" + " <- ".join(LAYERS) + "):\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    found = cycles(edges(all_modules()))
    assert not found, "import cycles:\n" + "\n".join(
        "  cycle:\n" + "\n".join(f"    {e}" for e in c) for c in found)


def test_folders_are_entered_through_their_faces() -> None:
    modules = all_modules()
    bad = past_faces(edges(modules), faces_of(modules))
    assert not bad, "imports past a folder's face:\n" + "\n".join(bad)


def test_no_import_runs_back_up() -> None:
    modules = all_modules()
    bad = back_up(edges(modules), faces_of(modules))
    assert not bad, "imports of an enclosing folder's modules:\n" + "\n".join(bad)


def test_only_faces_re_export() -> None:
    modules = all_modules()
    bad = re_exports(modules, faces_of(modules)) + face_problems(modules, faces_of(modules))
    assert not bad, "re-exports outside a face, or faces that are more than one:\n" + "\n".join(bad)


def test_the_top_level_holds_only_ground_floor_utilities() -> None:
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.name != "__init__.py")
    modules = all_modules()
    every, faces = edges(modules), faces_of(modules)
    for name in top:
        for e in every:
            assert not (e.src == f"{PKG}.{name}" and layer_of(e.dst, faces) != "ground"), \
                f"{e}: a top-level module is a ground-floor utility and imports only its peers"
    assert len(top) <= 6, f"the top level is for a few ground-floor utilities, not {top}"


def _tree(tmp_path: Path, files: dict[str, str]) -> tuple[dict[str, Path], Path]:
    root = tmp_path / PKG
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return all_modules(root), root


def test_the_checker_sees_each_kind_of_violation(tmp_path: Path) -> None:
    """The checks above can fail: a core module importing the store (inside a function), a cycle through
    a TYPE_CHECKING import, an import past a face, one back up, a leaf re-export and a face with code."""
    mods, root = _tree(tmp_path, {
        "__init__.py": '"""root"""\n',
        "config/__init__.py": '"""config"""\n\nfrom .load import read\n\n__all__ = ["read"]\n',
        "config/load.py": "import os\n\n\ndef read():\n    from ..store.calls import go\n    return go\n",
        "store/__init__.py": '"""store"""\n\nfrom .calls import go\n\n__all__ = ["go", "other"]\n\n\ndef f():\n'
                             "    pass\n",
        "store/calls.py": "from typing import TYPE_CHECKING\n\nfrom ..config import read\n\nif TYPE_CHECKING:\n"
                          "    from ..config.load import read as again\n\n\ndef go():\n    return read\n",
        "tiers/__init__.py": '"""tiers"""\n\nfrom .kinds import Tier\n\n__all__ = ["Tier"]\n',
        "tiers/kinds.py": "from .base import Tier\n",
        "tiers/base.py": "class Tier:\n    pass\n",
        "tiers/s3/__init__.py": '"""s3"""\n',
        "tiers/s3/tier.py": "from ..base import Tier\nfrom ..kinds import Tier as T2\n\n\nclass S3(Tier, T2):\n"
                            "    pass\n",
    })
    faces = faces_of(mods)
    got = edges(mods, tmp_path)
    assert [str(e) for e in got if e.src == f"{PKG}.config.load"] == \
        [f"{PKG}/config/load.py:5: {PKG}.config.load imports {PKG}.store.calls"]
    assert any("core may not import store" in b for b in against_layers(got, faces))
    assert cycles(got)
    assert past_faces(got, faces) == [f"{PKG}/config/load.py:5: {PKG}.config.load imports {PKG}.store.calls "
                                      f"(import `{PKG}.store`, its face)",
                                      f"{PKG}/store/calls.py:6: {PKG}.store.calls imports {PKG}.config.load "
                                      f"(import `{PKG}.config`, its face)"]
    assert back_up(got, faces) == [f"{PKG}/tiers/s3/tier.py:2: {PKG}.tiers.s3.tier imports {PKG}.tiers.kinds "
                                   f"(runs back up into {PKG}.tiers)"]  # tiers.base, the contract, is allowed
    assert sorted(re_exports(mods, faces, tmp_path)) == [
        f"{PKG}/store/calls.py:6: imports again and never uses it (a re-export?)",
        f"{PKG}/tiers/kinds.py:1: imports Tier and never uses it (a re-export?)"]
    problems = face_problems(mods, faces, tmp_path)
    assert f"{PKG}/store/__init__.py:8: a face holds no code (move it into a module of the folder)" in problems
    assert f"{PKG}/store/__init__.py: __all__ must list exactly the names the face imports" in problems
    with pytest.raises(AssertionError, match="has no layer"):
        layer_of(f"{PKG}.newfolder.x", faces)
    assert layer_of(f"{PKG}.fsio", faces) == "ground" and layer_of(f"{PKG}.store.calls", faces) == "store"
