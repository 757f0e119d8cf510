"""Module boundaries across lifeboat_cache, read from the source with `ast` (nothing imported).

- No module uses another module's private (underscore) names: no `from .x import _name`, no
  `module._name`, no `obj._name` / `super()._name` of a name that only another module of the package
  defines. A module's privates can then change without breaking a module that leaned on them. Names of
  SGLang's and MLX's own classes (the shims patch and read some) are theirs, not the package's, and are
  not counted.
- No module is over MAX_LINES lines: a module a newcomer can read in one sitting, with one job.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = "lifeboat_cache"
ROOT = Path(__file__).resolve().parents[3] / PKG
MAX_LINES = 400


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_privates(tree: ast.Module) -> set[str]:
    """Underscore names a module defines: its top-level names, its classes' names and methods, and the
    attributes its methods set on `self` / `cls`."""
    out: set[str] = set()

    def names_of(stmt: ast.stmt) -> list[str]:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [stmt.name]
        targets = stmt.targets if isinstance(stmt, ast.Assign) else \
            [stmt.target] if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) else []
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]

    for stmt in tree.body:
        out.update(names_of(stmt))
        if isinstance(stmt, ast.ClassDef):
            for member in stmt.body:
                out.update(names_of(member))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            out.add(node.attr)
    return {n for n in out if _private(n)}


def _is_package_import(node: ast.ImportFrom) -> bool:
    return bool(node.level) or (node.module or "").split(".")[0] == PKG


def violations(sources: dict[str, str]) -> list[str]:
    """`file:line: what` for every use of another module's private name; `sources` maps file -> text."""
    trees = {f: ast.parse(text, f) for f, text in sources.items()}
    own = {f: defined_privates(t) for f, t in trees.items()}
    bad = []
    for f, tree in trees.items():
        others = set().union(*(names for g, names in own.items() if g != f))
        elsewhere = others - own[f]
        package_aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _is_package_import(node):
                for a in node.names:
                    if _private(a.name):
                        bad.append(f"{f}:{node.lineno}: imports {a.name} from {'.' * node.level}{node.module or ''}")
                    package_aliases.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                package_aliases.update(a.asname or a.name.split(".")[0] for a in node.names
                                       if a.name.split(".")[0] == PKG)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            v = node.value
            if isinstance(v, ast.Name) and v.id in ("self", "cls"):
                continue
            module_attr = isinstance(v, ast.Name) and v.id in package_aliases
            super_attr = isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super"
            if module_attr or node.attr in elsewhere or (super_attr and node.attr in others):
                bad.append(f"{f}:{node.lineno}: uses {ast.unparse(v)}.{node.attr}")
    return bad


def package_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT.parent)): p.read_text() for p in sorted(ROOT.rglob("*.py"))}


def test_no_module_uses_another_modules_private_names() -> None:
    bad = violations(package_sources())
    assert not bad, "private names used across modules (make them public, or move the code):\n" + "\n".join(bad)


def test_no_module_is_over_the_line_limit() -> None:
    long = {f: text.count("\n") for f, text in package_sources().items() if text.count("\n") > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


def test_the_checker_sees_each_kind_of_violation() -> None:
    """The check can fail: each way of reaching into another module, and none of the allowed uses."""
    sources = {
        "lifeboat_cache/a.py": "class A:\n    def __init__(self):\n        self._lock = 1\n\n"
                               "    def _drop(self):\n        pass\n\n\ndef _helper():\n    pass\n",
        "lifeboat_cache/b.py": "from .a import _helper\nfrom lifeboat_cache import a\n\n\n"
                               "def f(d):\n    a._x\n    d._lock\n    return d._own\n\n\n"
                               "class B(a.A):\n    def _drop(self):\n        super()._drop()\n\n"
                               "    def _own(self):\n"
                               "        return self._lock, other._sglang_private\n",
    }
    assert violations(sources) == [
        "lifeboat_cache/b.py:1: imports _helper from .a",
        "lifeboat_cache/b.py:6: uses a._x",
        "lifeboat_cache/b.py:7: uses d._lock",
        "lifeboat_cache/b.py:13: uses super()._drop",
    ]
