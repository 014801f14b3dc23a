"""Backends beyond the default in-process one: where a child's runner runs.

Each backend is a module of its own, imported by name (``subagents.backends.<name>``), so
one whose dependency lives behind an extra costs nothing to a program that does not use it.
"""
