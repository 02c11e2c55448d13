"""The pass registry: name -> pass class. One pass, one module; each registers itself here."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from tuner.contract.errors import PassError
from tuner.passes.base import GraphPass

REGISTRY: dict[str, type[GraphPass]] = {}

# The order atomic rules are tried in when chained: producers of horizontal structure first
# (embedding bags, linears), then what consumes it (norms, pointwise, split/cat), layout last.
DEFAULT_ORDER: tuple[str, ...] = (
    "remove_dropout",
    "fold_conv_bn",
    "combine_sparse_inputs",
    "fuse_horizontal_embedding_bag",
    "fuse_horizontal_linear",
    "fuse_horizontal_layernorm",
    "fuse_horizontal_pointwise",
    "eliminate_split_cat",
    "tanh_via_sigmoid",
    "channels_last",
)


def register(cls: type[GraphPass]) -> type[GraphPass]:
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"pass {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def _discover() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")


def get_pass(name: str, **options: Any) -> GraphPass:
    _discover()
    try:
        return REGISTRY[name](**options)
    except KeyError:
        raise PassError(f"unknown pass {name!r}; known: {', '.join(pass_names())}") from None


def pass_names() -> list[str]:
    """Registered passes, in chaining order (unordered newcomers last, by name)."""
    _discover()
    ordered = [n for n in DEFAULT_ORDER if n in REGISTRY]
    return ordered + sorted(set(REGISTRY) - set(ordered))
