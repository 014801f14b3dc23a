"""The import graph of ``subagents/``, read from the source: no cycle, and the core never
imports an edge.

Every import statement counts, wherever it stands: at module level, under
``TYPE_CHECKING`` (a type-only import is still a dependency a reader follows) and inside a
function (a lazy import that dodges a cycle at run time still is one). Relative and
absolute forms resolve to the same module; ``from . import x`` names the submodule ``x``.
"""

from __future__ import annotations

import ast
import itertools
import pathlib
import re
from collections.abc import Iterator, Mapping

import attrs
import pytest

import subagents

PACKAGE = pathlib.Path(subagents.__file__).parent

EDGE = re.compile(
    r"subagents\.(tools(\..+)?|store(\..+)?|room(\..+)?|backends(\..+)?|mcp|_cli\w*|_demo|testing|_conformance\w*)"
)
"""Modules around the core: the tools package, the durable store and the room on it, the
MCP server, the command line, the demo, test helpers (``testing`` and the conformance
suites it ships)."""
FACADE = frozenset({"subagents", "subagents.__main__", "subagents.typing", "subagents._moved"})
"""The public faces: they re-export core and edges alike."""

BACK_REFERENCES = frozenset(
    {
        ("subagents._spec", "subagents._context"),
        ("subagents._context", "subagents._manager"),
    }
)
"""The imports that point back up the graph: type-only, each naming a public type in a
public annotation. The public types are mutually recursive (an ``AgentSpec``'s runner
takes a ``RunContext``, whose ``spawn`` returns a ``SpawnHandle`` of a child that has an
``AgentSpec``; ``RunContext.manager`` is the ``SubagentManager`` that made it), so some
annotation must name a type from a module above it; these two are the ones, and only the
type checker follows them. Any other cycle, type-only imports included, fails."""


@attrs.frozen
class Import:
    """One import statement of one module of the package."""

    source: str
    target: str
    line: int
    kind: str
    """``runtime``, ``type-only`` (under ``if TYPE_CHECKING``) or ``lazy`` (in a function)."""


def module_names(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every module under ``root`` (a package directory) by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking(test: ast.expr) -> bool | None:
    """True for ``if TYPE_CHECKING``, False for ``if not TYPE_CHECKING``, else None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _type_checking(test.operand)
        return None if inner is None else not inner
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
    return True if name == "TYPE_CHECKING" else None


def _kinds(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    def visit(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, kind
        inner = kind
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = "lazy"
        elif isinstance(node, ast.If) and (checking := _type_checking(node.test)) is not None:
            only = "type-only" if kind == "runtime" else kind
            for child in node.body:
                yield from visit(child, only if checking else kind)
            for child in node.orelse:
                yield from visit(child, kind if checking else only)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner)

    yield from visit(tree, "runtime")


def imports(root: pathlib.Path) -> list[Import]:
    """Every import between modules of the package at ``root``."""
    modules = module_names(root)
    top = root.name
    found = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, kind in _kinds(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                for alias in node.names:
                    submodule = f"{module}.{alias.name}"
                    targets.append(submodule if submodule in modules else module)
            for target in targets:
                # ``import a.b.c`` depends on a.b.c; keep the longest known module.
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                if target in modules and target != name and target.split(".")[0] == top:
                    found.append(Import(name, target, node.lineno, kind))
    return list(dict.fromkeys(found))


def graph(edges: list[Import]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for edge in edges:
        out.setdefault(edge.source, set()).add(edge.target)
        out.setdefault(edge.target, set())
    return out


def cycles(deps: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(deps):
        if start in index:
            continue
        work = [(start, iter(sorted(deps[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(deps[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def shortest_cycle(component: frozenset[str], edges: list[Import], through: set[str]) -> str:
    """The shortest cycle inside ``component`` through a module of ``through``, one import
    a line, to say where to cut."""
    by_pair: dict[tuple[str, str], Import] = {}
    for e in edges:
        if e.source in component and e.target in component:
            by_pair.setdefault((e.source, e.target), e)
    following: dict[str, list[str]] = {}
    for source, target in sorted(by_pair):
        following.setdefault(source, []).append(target)
    best: list[str] = []
    for start in sorted(through):
        paths = {start: [start]}
        frontier = [start]
        for node in frontier:  # appended to while read: breadth first
            for target in following.get(node, []):
                if target == start:
                    if not best or len(paths[node]) + 1 < len(best):
                        best = [*paths[node], start]
                elif target not in paths:
                    paths[target] = [*paths[node], target]
                    frontier.append(target)
    lines = []
    for source, target in itertools.pairwise(best):
        e = by_pair[source, target]
        lines.append(f"  {source} -> {target} (line {e.line}, {e.kind})")
    return "\n".join(lines)


def is_core(module: str) -> bool:
    return module not in FACADE and not EDGE.fullmatch(module)


EDGES_FOUND = imports(PACKAGE)


def test_no_import_cycle() -> None:
    edges = [e for e in EDGES_FOUND if (e.source, e.target) not in BACK_REFERENCES]
    found = cycles(graph(edges))
    assert not found, "import cycles:\n" + "\n\n".join(
        shortest_cycle(c, edges, set(c)) for c in found
    )


@pytest.mark.parametrize("edge", sorted(BACK_REFERENCES))
def test_each_back_reference_is_a_type_only_import(edge: tuple[str, str]) -> None:
    back = [e for e in EDGES_FOUND if (e.source, e.target) == edge]
    assert back, f"{edge} is gone: strike it from BACK_REFERENCES"
    assert {e.kind for e in back} == {"type-only"}


def test_without_type_only_imports_the_graph_has_no_cycle() -> None:
    runtime = [e for e in EDGES_FOUND if e.kind != "type-only"]
    found = cycles(graph(runtime))
    assert not found, "\n\n".join(shortest_cycle(c, runtime, set(c)) for c in found)


OPTIONAL = frozenset({("subagents._cli_mcp", "subagents.mcp")})
"""The deferred imports allowed: a command importing the module that wraps an optional
extra once the command runs. ``subagents.mcp`` imports the MCP SDK, which only
``subagents[mcp]`` installs: imported at the top of the command line, it would break every
other command without the extra (and slow each one down with it)."""


def test_no_module_defers_an_import_of_the_package_into_a_function() -> None:
    lazy = [e for e in EDGES_FOUND if e.kind == "lazy" and (e.source, e.target) not in OPTIONAL]
    assert not lazy, "\n".join(f"{e.source} -> {e.target} (line {e.line})" for e in lazy)


@pytest.mark.parametrize("edge", sorted(OPTIONAL))
def test_each_optional_import_is_deferred_and_the_only_way_in(edge: tuple[str, str]) -> None:
    source, target = edge
    found = [e for e in EDGES_FOUND if (e.source, e.target) == edge]
    assert found, f"{edge} is gone: strike it from OPTIONAL"
    assert {e.kind for e in found} == {"lazy"}
    assert {e.source for e in EDGES_FOUND if e.target == target} == {source}


def test_the_core_never_imports_an_edge_or_the_facade() -> None:
    outward = [e for e in EDGES_FOUND if is_core(e.source) and not is_core(e.target)]
    assert not outward, "\n".join(
        f"{e.source} imports {e.target} (line {e.line}, {e.kind})" for e in outward
    )


def test_the_tools_are_an_edge_of_the_core() -> None:
    tools = {e.target for e in EDGES_FOUND if e.source.startswith("subagents.tools.")}
    assert "subagents._completions" in tools
    assert "subagents.tools._tool" in tools
    assert all(is_core(t) or t.startswith("subagents.tools") for t in tools), tools


# ------------------------------------------------------------------ the reader itself


def test_the_reader_sees_every_form_of_import(tmp_path: pathlib.Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .a import A\n")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nimport pkg.b\nif TYPE_CHECKING:\n"
        "    from .sub.c import C\nA = 1\n"
    )
    (package / "b.py").write_text(
        "import typing\ndef f():\n    from . import a\n"
        "if not typing.TYPE_CHECKING:\n    from .sub import d\nelse:\n    from .sub import c\n"
    )
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text("from ..a import A\nimport os\n")
    (package / "sub" / "d.py").write_text("")
    found = {(e.source, e.target, e.kind) for e in imports(package)}
    assert found == {
        ("pkg", "pkg.a", "runtime"),
        ("pkg.a", "pkg.b", "runtime"),
        ("pkg.a", "pkg.sub.c", "type-only"),
        ("pkg.b", "pkg.a", "lazy"),
        ("pkg.b", "pkg.sub.d", "runtime"),
        ("pkg.b", "pkg.sub.c", "type-only"),
        ("pkg.sub.c", "pkg.a", "runtime"),
    }
    assert cycles(graph(imports(package))) == [frozenset({"pkg.a", "pkg.b", "pkg.sub.c"})]


@pytest.mark.parametrize(
    ("module", "core"),
    [
        ("subagents._manager", True),
        ("subagents._completions", True),
        ("subagents.tools", False),
        ("subagents.tools._wait", False),
        ("subagents.store", False),
        ("subagents.store._mailbox", False),
        ("subagents.mcp", False),
        ("subagents._cli_mcp", False),
        ("subagents._cli_events", False),
        ("subagents.testing", False),
        ("subagents._conformance_mailbox", False),
        ("subagents.typing", False),
        ("subagents", False),
    ],
)
def test_core_and_edges_are_told_apart(module: str, core: bool) -> None:
    assert is_core(module) is core


ENGINE = frozenset(
    {
        "subagents._manager",
        "subagents._limiter",
        "subagents._watchdog",
        "subagents._sessions",
        "subagents._child",
        "subagents._spawning",
        "subagents._record",
        "subagents._handle",
        "subagents._context",
        "subagents._completions",
        "subagents._lookup",
    }
)
"""The engine's parts and facade (design/core.md): the store reaches none of them; it
meets the engine at the seams the core defines (``_mailbox``, ``_journal``)."""


def test_the_store_is_an_edge_that_never_reaches_into_the_engine() -> None:
    store = [e for e in EDGES_FOUND if e.source.startswith("subagents.store")]
    assert store, "the store package imports nothing of the core?"
    reaches = [e for e in store if e.target in ENGINE or e.target in FACADE]
    assert not reaches, "\n".join(f"{e.source} imports {e.target} (line {e.line})" for e in reaches)
    assert all(is_core(e.target) or e.target.startswith("subagents.store") for e in store)
    into = [e.source for e in EDGES_FOUND if e.target.startswith("subagents.store")]
    # Only the store itself; the package's face, which imports it so that its opener is
    # registered for SubagentConfig(store_path=...); the command line's `store` command,
    # an edge around the store; the `batch` command's modules that open the store, keep
    # the batch in it and read it back; and the room, which shares its file.
    outside = {
        "subagents",
        "subagents._cli_store",
        "subagents._cli_batch_journal",
        "subagents._cli_batch_run",
        "subagents._cli_batch_status",
    }
    assert all(s.startswith(("subagents.store", "subagents.room")) or s in outside for s in into), (
        into
    )
