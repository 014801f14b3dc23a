"""Dependencies are used through their public APIs only.

An AST walk over every module under ``subagents/`` fails on an import from a dependency's
private module (``from anyio._core ...``, ``import trio._core``, ``from opentelemetry
import _logs``) and on a private attribute read through a name bound by importing a
dependency (``trace._TRACER_PROVIDER``, ``anyio.lowlevel._x``). Some reaches go through
objects whose origin an AST cannot follow, so a short list of known ones is matched
anywhere: a cancel scope's private state, flipping ``.shield`` on a live scope, and the
names of OpenTelemetry's private globals and classes (in code or in a string), and a
backend reached through ``sys.modules`` behind anyio's back.

Our own private names (``self._x``, ``handle._trace``, ``from ._spec import _Unset``) are
not a dependency's and never match.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "subagents"
OWN = "subagents"

# Private names of dependencies, matched wherever they appear (attribute or string).
KNOWN_PRIVATE = frozenset(
    {"_TRACER_PROVIDER", "_METER_PROVIDER", "_ProxyMeterProvider", "_PROXY_TRACER_PROVIDER"}
)


def _third_party(module: str) -> bool:
    top = module.split(".")[0]
    return top != OWN and top not in sys.stdlib_module_names and top != "__future__"


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _is_sys_modules(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "modules"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _names_dependency(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Constant) and isinstance(node.value, str) and _third_party(node.value)
    )


class _Walker:
    """The checks, one per kind of node; :func:`offences` feeds it every node."""

    def __init__(self) -> None:
        self.dependency_names: set[str] = set()  # names bound by importing a dependency
        self.offences: list[tuple[int, str]] = []

    def _offence(self, node: ast.AST, what: str) -> None:
        self.offences.append((getattr(node, "lineno", 0), what))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not _third_party(alias.name):
                continue
            if any(_private(part) for part in alias.name.split(".")):
                self._offence(node, f"import {alias.name}")
            self.dependency_names.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or not _third_party(module):
            return
        if any(_private(part) for part in module.split(".")):
            self._offence(node, f"from {module} import ...")
        for alias in node.names:
            if _private(alias.name):
                self._offence(node, f"from {module} import {alias.name}")
            self.dependency_names.add(alias.asname or alias.name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in KNOWN_PRIVATE:
            self._offence(node, f".{node.attr}")
        if _private(node.attr):
            root: ast.expr = node.value
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id in self.dependency_names:
                self._offence(node, f"{root.id}...{node.attr}")
            if isinstance(node.value, ast.Attribute) and node.value.attr == "cancel_scope":
                self._offence(node, f"cancel_scope.{node.attr}")
        if isinstance(node.ctx, ast.Store) and node.attr == "shield":
            self._offence(node, ".shield = (flipping a live cancel scope)")

    def visit_Call(self, node: ast.Call) -> None:
        # getattr(trace, "_TRACER_PROVIDER") reads the same private attribute.
        if (
            isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in self.dependency_names
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            self._offence(node, f"{node.func.id}({node.args[0].id}, {node.args[1].value!r})")
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "get"
            and _is_sys_modules(func.value)
            and node.args
            and _names_dependency(node.args[0])
        ):
            self._offence(node, "sys.modules.get(...) of a dependency")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        # sys.modules["trio"]: a backend used behind anyio's back, without importing it.
        if _is_sys_modules(node.value) and _names_dependency(node.slice):
            self._offence(node, "sys.modules[...] of a dependency")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value in KNOWN_PRIVATE:
            self._offence(node, f"the string {node.value!r}")


def offences(source: str) -> list[tuple[int, str]]:
    """Every reach into a dependency's privates in ``source``, as (line, what)."""
    tree = ast.parse(source)
    walker = _Walker()
    # Imports first: a function above an import may use the name it binds.
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            walker.visit_Import(node)
        elif isinstance(node, ast.ImportFrom):
            walker.visit_ImportFrom(node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            walker.visit_Attribute(node)
        elif isinstance(node, ast.Call):
            walker.visit_Call(node)
        elif isinstance(node, ast.Subscript):
            walker.visit_Subscript(node)
        elif isinstance(node, ast.Constant):
            walker.visit_Constant(node)
    return sorted(walker.offences)


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_module_uses_dependencies_through_public_apis_only(path: Path) -> None:
    found = offences(path.read_text(encoding="utf-8"))
    assert found == [], "\n".join(f"{path.name}:{line}: {what}" for line, what in found)


WRAPPED = {
    "orjson": {"_json.py"},
    "tenacity": {"_retry.py"},
    "opentelemetry": {"_tracing.py", "_tool_tracing.py"},
    "mcp": {"mcp.py"},
    "uvicorn": {"mcp.py"},
    "ray": {"backends/ray.py", "backends/_ray_worker.py"},
}
"""Each dependency the package wraps, and the modules that import it (anyio and attrs
are the foundation every module builds on, so they are not wrapped). The MCP SDK (and
uvicorn, which serves its streamable HTTP) come with the ``mcp`` extra, ray with ``ray``
(its backend's driver side and worker side, the two modules that import it). OpenTelemetry
has two: ``_tracing`` (a child's spans, links and the metrics) and ``_tool_tracing`` (a
tool call's span), split so that each stays one job under the module size limit."""
PACKAGES = {"mcp": ("mcp", "mcp_types")}
"""The top-level packages a dependency installs, when more than its own name (the SDK's
types are a package of their own)."""


def _importers(dependency: str) -> set[str]:
    """Every module under ``subagents/`` with an import of ``dependency`` anywhere in it
    (under ``TYPE_CHECKING`` and inside functions too)."""
    found = set()
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            tops = PACKAGES.get(dependency, (dependency,))
            if any(name.split(".")[0] in tops for name in names):
                found.add(str(path.relative_to(PACKAGE)))
    return found


@pytest.mark.parametrize(("dependency", "module"), sorted(WRAPPED.items()))
def test_a_wrapped_dependency_is_imported_in_its_modules_only(
    dependency: str, module: set[str]
) -> None:
    assert _importers(dependency) == module


def test_every_module_is_checked() -> None:
    names = {p.name for p in MODULES}
    assert {"_manager.py", "_tracing.py", "_limiter.py", "__init__.py"} <= names


@pytest.mark.parametrize(
    "source",
    [
        "from anyio._core._eventloop import get_async_backend",
        "import trio._core",
        "import trio._core as core",
        "from opentelemetry import _logs",
        "from opentelemetry.trace import _Proxy",
        "from opentelemetry import trace\nx = trace._TRACER_PROVIDER",
        "import opentelemetry.metrics as m\nx = m._internal._METER_PROVIDER",
        "import anyio\nx = anyio.lowlevel._private",
        "import anyio\nx = anyio.get_current_task()._thing",
        "from anyio import CancelScope\nx = CancelScope._deadline",
        "from opentelemetry import trace\nx = getattr(trace, '_TRACER_PROVIDER', None)",
        "def f(p):\n    return type(p).__name__ != '_ProxyMeterProvider'",
        "def f(tg):\n    return tg.cancel_scope._cancel_called",
        "def f(scope):\n    scope.shield = True",
        "import sys\nx = sys.modules['trio'].lowlevel.checkpoint",
        "import sys\nx = sys.modules.get('trio')",
        "def f():\n    return trace._x\nfrom opentelemetry import trace",
    ],
)
def test_each_kind_of_reach_is_caught(source: str) -> None:
    assert offences(source), source


@pytest.mark.parametrize(
    "source",
    [
        "from ._spec import UNSET, _Unset",
        "from . import _tracing\nx = _tracing._global_tracer",
        "class A:\n    def f(self):\n        return self._x",
        "def f(handle):\n    return handle._trace._span",
        "import anyio\nwith anyio.CancelScope(shield=True):\n    pass",
        "import anyio\nx = anyio.__name__",
        "from opentelemetry import trace\nx = trace.ProxyTracer",
        "import sys\nx = sys._getframe",
        "import sys\nx = sys.modules.get('asyncio')",
        "import sys\nx = sys.modules[__name__]",
        "from subagents._spec import _Unset",
        "x = '_private but not a dependency name'",
    ],
)
def test_our_own_private_names_are_not_flagged(source: str) -> None:
    assert offences(source) == [], source
