"""What ``RayBackend``'s ``resources`` argument becomes in Ray's options (no ray import)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._errors import ConfigError
from .._validators import number, text

__all__ = ["placement"]


def placement(resources: Mapping[str, object] | None) -> dict[str, Any]:
    """Ray's options for ``resources``: ``CPU`` and ``GPU`` as Ray's own arguments.

    Raises:
        ConfigError: ``resources`` is not a mapping of names to amounts, naming it.
    """
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise ConfigError("resources", "a mapping of resource names to amounts", resources)
    options: dict[str, Any] = {}
    custom: dict[str, float] = {}
    for name, amount in resources.items():
        key = text("resources", name)
        value = number(f"resources[{key!r}]", amount)
        if key == "CPU":
            options["num_cpus"] = value
        elif key == "GPU":
            options["num_gpus"] = value
        else:
            custom[key] = value
    if custom:
        options["resources"] = custom
    return options
