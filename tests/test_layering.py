"""The layering rules of docs/architecture.md, checked on the source with `ast` (nothing is imported).

The import graph covers `c2jax/`, `kernels_pallas/` and `experiments/`: one node per module (a
package's `__init__.py` is the package itself), one edge per import statement, top-level or inside
a function. Three rules, each a test:
- no circle between modules (and none between the packages of `c2jax/`);
- no import of a higher floor than the importer's (`FLOORS` mirrors the table in the doc);
- no import of a `_private` name from another module (`from m import _x` or `m._x` after `import m`).
Plus: no module of the package over `MAX_LINES` lines.

Each rule has a positive control: the same checker run on a small synthetic tree that breaks it
must report it, so a checker that silently reports nothing fails.

`python tests/test_layering.py` prints the graph's size and every violation.
"""
from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("c2jax", "kernels_pallas", "experiments")
MAX_LINES = 600

# Floor of each module prefix, higher number = higher floor (docs/architecture.md, top to bottom).
# The longest matching prefix wins. A module may import its own floor or any lower one.
FLOORS: dict[str, int] = {
    "experiments": 7,
    "c2jax.workflow": 7,
    "c2jax.train": 6,
    "c2jax.bench": 5,
    "c2jax.serve": 5,
    "c2jax.agent": 4,
    "c2jax.sampling": 3,
    "c2jax.model": 2,
    "c2jax.losses": 2,
    "c2jax.rl": 2,
    "kernels_pallas": 1,
    "c2jax.envs": 1,
    "c2jax.data": 1,
    "c2jax.config": 1,
    "c2jax.registry": 1,
    "c2jax.trajectory": 1,
    "c2jax.batching": 1,
    "c2jax.checkpoint": 1,
    "c2jax.atomic": 1,
    "c2jax.compile_cache": 1,
    "c2jax.sync": 1,
}
# Entries that name one module only, not the modules under it: a new top-level module of c2jax must
# be given its floor above (and in docs/architecture.md), not inherit one by accident.
EXACT_FLOORS: dict[str, int] = {"c2jax": 1}
FLOOR_NAMES = {7: "experiments and research workflow", 6: "training stages", 5: "benchmark and serving", 4: "agent",
               3: "sampling", 2: "model, losses, RL objectives", 1: "foundations"}


@dataclasses.dataclass(frozen=True)
class Import:
    """One import of `target` (a module of the graph) by `source`, at `line`."""

    source: str
    target: str
    line: int
    type_only: bool = False  # under `if TYPE_CHECKING:`: never executed, so it cannot close a circle


@dataclasses.dataclass(frozen=True)
class PrivateUse:
    """`source` reaches the private name `name` of the other module `target`, at `line`."""

    source: str
    target: str
    name: str
    line: int


@dataclasses.dataclass
class ImportGraph:
    """Modules (dotted name -> file), imports between them, and private names reached across."""

    modules: dict[str, Path]
    imports: list[Import]
    private_uses: list[PrivateUse]

    def digraph(self) -> nx.DiGraph:
        graph = nx.DiGraph()
        graph.add_nodes_from(self.modules)
        graph.add_edges_from((imp.source, imp.target) for imp in self.imports
                             if imp.source != imp.target and not imp.type_only)
        return graph


def module_name(root: Path, path: Path) -> str:
    """`c2jax/envs/pool.py` -> `c2jax.envs.pool`; `c2jax/envs/__init__.py` -> `c2jax.envs`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(modules: Mapping[str, Path], name: str) -> bool:
    return name in modules and modules[name].name == "__init__.py"


def _resolve_relative(modules: Mapping[str, Path], source: str, level: int, module: str | None) -> str:
    """The absolute module a `from .x import y` in `source` names."""
    base = source.split(".")
    if not _is_package(modules, source):
        base = base[:-1]  # a plain module's `.` is its package
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def _owner(modules: Mapping[str, Path], dotted: str) -> str | None:
    """The longest prefix of `dotted` that is a module of the graph (None: outside the graph)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) bodies."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for stmt in node.body:
                inside.update(id(n) for n in ast.walk(stmt))
    return inside


def _scan_module(modules: Mapping[str, Path], source: str, tree: ast.AST) -> tuple[list[Import], list[PrivateUse]]:
    imports: list[Import] = []
    private: list[PrivateUse] = []
    bound_modules: dict[str, str] = {}  # local name -> graph module it names (for `m._x`)
    type_only = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _owner(modules, alias.name)
                if target is None:
                    continue
                imports.append(Import(source, target, node.lineno, id(node) in type_only))
                if alias.asname:
                    bound_modules[alias.asname] = target
                elif target == alias.name and "." not in alias.name:
                    bound_modules[alias.name] = target
        elif isinstance(node, ast.ImportFrom):
            base = (_resolve_relative(modules, source, node.level, node.module) if node.level
                    else node.module or "")
            base_owner = _owner(modules, base)
            if base_owner is None:
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:  # `from pkg import submodule`
                    imports.append(Import(source, submodule, node.lineno, id(node) in type_only))
                    bound_modules[alias.asname or alias.name] = submodule
                    private_module = _is_private(alias.name) and not source.startswith(base + ".")
                    if private_module:
                        private.append(PrivateUse(source, base, alias.name, node.lineno))
                    continue
                imports.append(Import(source, base_owner, node.lineno, id(node) in type_only))
                if _is_private(alias.name) and base_owner != source:
                    private.append(PrivateUse(source, base_owner, alias.name, node.lineno))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _is_private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in bound_modules and bound_modules[node.value.id] != source):
            target = bound_modules[node.value.id]
            if f"{target}.{node.attr}" not in modules or not source.startswith(target + "."):
                private.append(PrivateUse(source, target, node.attr, node.lineno))
    return imports, private


def build_graph(root: Path, packages: Sequence[str] = ROOTS) -> ImportGraph:
    """Parse every `.py` under `root/<package>` for each package and return the import graph."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            modules[module_name(root, path)] = path
    imports: list[Import] = []
    private: list[PrivateUse] = []
    for name, path in modules.items():
        found_imports, found_private = _scan_module(modules, name, ast.parse(path.read_text(), str(path)))
        imports += found_imports
        private += found_private
    return ImportGraph(modules, imports, private)


def floor_of(module: str, floors: Mapping[str, int] = FLOORS, exact: Mapping[str, int] = EXACT_FLOORS) -> int:
    """The floor of `module` in `exact`, else of its longest `floors` prefix (KeyError: no floor)."""
    if module in exact:
        return exact[module]
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in floors:
            return floors[prefix]
    raise KeyError(f"module {module!r} has no floor in the table")


def module_cycles(graph: ImportGraph) -> list[list[str]]:
    """Each import circle between modules, as its strongly connected component (sorted names)."""
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph.digraph()) if len(c) > 1)


def _subpackage(graph: ImportGraph, module: str) -> str | None:
    """The package directly under a root that holds `module` (`c2jax.envs.synth.x` -> `c2jax.envs`);
    None for a plain module of a root (`c2jax.losses`)."""
    head = ".".join(module.split(".")[:2])
    return head if _is_package(graph.modules, head) else None


def package_cycles(graph: ImportGraph) -> list[list[str]]:
    """Import circles between the packages directly under a root (`c2jax.serve` <-> `c2jax.agent`)."""
    packages = nx.DiGraph()
    for imp in graph.imports:
        src, dst = _subpackage(graph, imp.source), _subpackage(graph, imp.target)
        if src and dst and src != dst and not imp.type_only:
            packages.add_edge(src, dst)
    return sorted(sorted(c) for c in nx.strongly_connected_components(packages) if len(c) > 1)


def upward_imports(graph: ImportGraph, floors: Mapping[str, int] = FLOORS) -> list[Import]:
    """Every import of a module on a higher floor than its importer's."""
    return [imp for imp in graph.imports if floor_of(imp.target, floors) > floor_of(imp.source, floors)]


def oversized_modules(graph: ImportGraph, max_lines: int = MAX_LINES) -> dict[str, int]:
    lengths = {name: len(path.read_text().splitlines()) for name, path in graph.modules.items()}
    return {name: n for name, n in sorted(lengths.items()) if n > max_lines}


def report(graph: ImportGraph, floors: Mapping[str, int] = FLOORS) -> str:
    edges = graph.digraph().number_of_edges()
    used = sorted({floor_of(m, floors) for m in graph.modules}, reverse=True)
    return (f"import graph: {len(graph.modules)} modules, {edges} edges, {len(used)} floors "
            f"({', '.join(FLOOR_NAMES.get(f, str(f)) for f in used)})")


def _fmt(items: Iterable[object]) -> str:
    return "\n".join(f"  {item}" for item in items)


# ---------------------------------------------------------------- the repository itself


@pytest.fixture(scope="module")
def repo_graph() -> ImportGraph:
    return build_graph(REPO)


def test_graph_size_is_reported(repo_graph: ImportGraph, capsys: pytest.CaptureFixture) -> None:
    text = report(repo_graph)
    with capsys.disabled():
        print("\n" + text)
    assert len(repo_graph.modules) > 100 and len(repo_graph.imports) > 200, text


def test_every_module_has_a_floor(repo_graph: ImportGraph) -> None:
    missing = []
    for name in repo_graph.modules:
        try:
            floor_of(name)
        except KeyError:
            missing.append(name)
    assert not missing, f"give these modules a floor in FLOORS and docs/architecture.md: {missing}"


def test_no_module_circles(repo_graph: ImportGraph) -> None:
    cycles = module_cycles(repo_graph)
    assert not cycles, "import circles between modules:\n" + _fmt(cycles)


def test_no_package_circles(repo_graph: ImportGraph) -> None:
    cycles = package_cycles(repo_graph)
    assert not cycles, "import circles between packages:\n" + _fmt(cycles)


def test_no_upward_imports(repo_graph: ImportGraph) -> None:
    upward = upward_imports(repo_graph)
    assert not upward, "imports of a higher floor:\n" + _fmt(upward)


def test_no_private_names_across_modules(repo_graph: ImportGraph) -> None:
    assert not repo_graph.private_uses, "private names used across modules:\n" + _fmt(repo_graph.private_uses)


def test_no_module_over_the_line_limit(repo_graph: ImportGraph) -> None:
    big = oversized_modules(repo_graph)
    assert not big, f"modules over {MAX_LINES} lines: {big}"


# ---------------------------------------------------------------- positive controls


def _write_tree(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


SYNTHETIC = {
    "pkg/__init__.py": "",
    "pkg/low/__init__.py": "",
    # a circle through an in-function import and a relative import
    "pkg/low/a.py": "from pkg.low import b\n",
    "pkg/low/b.py": "def f():\n    from . import c\n",
    "pkg/low/c.py": "import pkg.low.a as a_mod\n",
    # upward: the low floor takes a name from the high floor
    "pkg/low/d.py": "from pkg.high.top import Thing\n",
    "pkg/high/__init__.py": "",
    "pkg/high/top.py": (
        "from pkg.low.e import _hidden, public\n"  # private via from-import
        "import pkg.low.e as e\n"
        "x = e._also_hidden\n"                      # private via attribute
        "class Thing:\n    pass\n"),
    "pkg/low/e.py": "public = 1\n_hidden = 2\n_also_hidden = 3\n" + "# filler\n" * 20,
    "pkg/low/clean.py": "from .e import public\n",
    # an import only type checkers see closes no circle (but still counts for floors)
    "pkg/low/f.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.low.g import G\n",
    "pkg/low/g.py": "from pkg.low.f import TYPE_CHECKING\nclass G:\n    pass\n",
}
SYNTHETIC_FLOORS = {"pkg.high": 2, "pkg.low": 1, "pkg": 1}


@pytest.fixture()
def synthetic_graph(tmp_path: Path) -> ImportGraph:
    _write_tree(tmp_path, SYNTHETIC)
    return build_graph(tmp_path, ["pkg"])


def test_control_circle_is_reported(synthetic_graph: ImportGraph) -> None:
    assert module_cycles(synthetic_graph) == [["pkg.low.a", "pkg.low.b", "pkg.low.c"]]


def test_control_package_circle_is_reported(tmp_path: Path) -> None:
    _write_tree(tmp_path, {"pkg/__init__.py": "", "pkg/x/__init__.py": "", "pkg/y/__init__.py": "",
                           "pkg/x/m.py": "from pkg.y.n import f\n", "pkg/y/n.py": "f = 1\n",
                           "pkg/y/k.py": "from pkg.x import m\n"})
    graph = build_graph(tmp_path, ["pkg"])
    assert module_cycles(graph) == []  # no circle between modules ...
    assert package_cycles(graph) == [["pkg.x", "pkg.y"]]  # ... but one between packages


def test_control_upward_import_is_reported(synthetic_graph: ImportGraph) -> None:
    upward = upward_imports(synthetic_graph, SYNTHETIC_FLOORS)
    assert [(imp.source, imp.target) for imp in upward] == [("pkg.low.d", "pkg.high.top")]


def test_control_private_names_are_reported(synthetic_graph: ImportGraph) -> None:
    found = sorted((u.source, u.target, u.name) for u in synthetic_graph.private_uses)
    assert found == [("pkg.high.top", "pkg.low.e", "_also_hidden"), ("pkg.high.top", "pkg.low.e", "_hidden")]


def test_control_oversized_module_is_reported(synthetic_graph: ImportGraph) -> None:
    assert oversized_modules(synthetic_graph, max_lines=10) == {"pkg.low.e": 23}


def test_control_module_without_floor_is_an_error(synthetic_graph: ImportGraph) -> None:
    with pytest.raises(KeyError, match="pkg.low.a"):
        floor_of("pkg.low.a", {"pkg.high": 2}, {})
    with pytest.raises(KeyError, match="pkg.new_module"):  # an exact entry does not cover submodules
        floor_of("pkg.new_module", {"pkg.high": 2}, {"pkg": 1})


if __name__ == "__main__":
    graph = build_graph(REPO)
    print(report(graph))
    problems = {
        "module circles": module_cycles(graph),
        "package circles": package_cycles(graph),
        "upward imports": upward_imports(graph),
        "private names across modules": graph.private_uses,
        f"modules over {MAX_LINES} lines": list(oversized_modules(graph).items()),
    }
    for title, items in problems.items():
        print(f"{title}: {len(items)}")
        print(_fmt(items)) if items else None
    sys.exit(1 if any(problems.values()) else 0)
