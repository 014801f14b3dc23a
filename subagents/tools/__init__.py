"""The LLM tools: ``spawn_agent``, ``wait_agent``, ``delegate_to_agent``, ``cancel_agent``
and ``list_agents``, bound to one session of a :class:`~subagents.SubagentManager`.

:func:`build_tools` returns a :class:`Toolset`; a host agent loop hands its definitions to
its model (OpenAI, Anthropic or MCP shapes) and runs each call through
:meth:`Toolset.call` under its own per-tool timeout. Every result is a
:class:`ToolResult`; tool errors are data, never exceptions.

This package imports the core runtime and is never imported by it.
"""

from ._build import Toolset, build_tools
from ._tool import Tool, ToolLimits, ToolResult

__all__ = ["Tool", "ToolLimits", "ToolResult", "Toolset", "build_tools"]

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
