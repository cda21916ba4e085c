"""The layers hold: the import-linter contracts of pyproject.toml, run by the test command.

The core (the trace contract and its I/O) imports nothing above it; collectors,
analyzers and the live stream never import the presentation layers; only the
CLI imports the CLI. A new module of ``tracetool/`` must be placed in a layer. And no two
modules import each other, however indirectly: not at the top, not inside a function, not under
``TYPE_CHECKING`` (a circle is a definition in the wrong module).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_are_kept() -> None:
    code = ("import sys\nfrom importlinter.cli import lint_imports\n"
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "broken" in r.stdout and "0 broken" in r.stdout  # it ran the contracts, not nothing


def test_every_tracetool_module_has_a_layer() -> None:
    """The core contract lists the core and everything above it: a module in neither list would
    be checked by no contract."""
    from importlinter import api

    contracts = api.read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    core = next(c for c in contracts if c["name"] == "The core imports nothing above it")
    placed = set(core["source_modules"]) | set(core["forbidden_modules"])
    modules = {f"tracetool.{p.stem}" for p in (ROOT / "tracetool").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert modules - placed == set(), "place these in [tool.importlinter] (core or above it)"
    assert placed - modules - {"analyzers", "collectors"} == set(), "contracts name modules that are gone"


PACKAGES = ("tracetool", "analyzers", "collectors")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the three packages it imports anywhere in its source: every
    ``import`` and ``from ... import`` statement, at the top, in a function or under TYPE_CHECKING
    (``from pkg import name`` is the module ``pkg.name`` when there is one, else ``pkg``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    graph[mod].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph()
    assert {"tracetool.tui.app", "tracetool.tui.screens.overview"} <= set(graph)  # it read the tree
    assert "tracetool.tui.screens.overview" in graph["tracetool.tui.app"]
    found = cycles(graph)
    said = ["; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c) for c in found]
    assert found == [], "import cycles:\n" + "\n".join(said)
