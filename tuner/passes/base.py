"""The contract every pass ("atomic rule") fulfils."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import fx

from tuner.graph.sites import Site
from tuner.passes.source_digest import source_digest


@functools.cache
def _code_digest(module: str, torch_version: str) -> str:
    """Read once per process (sources do not change under a running tuner); keyed by the torch
    version only so that the memo follows it."""
    return source_digest(module, ("tuner", module.partition(".")[0]))


class GraphPass(ABC):
    """Finds its sites in an unlifted export graph and rewrites any chosen subset of them.

    Sites returned by one `find_sites` call never overlap, so rewriting some of them leaves the
    others valid. A rewrite must keep outputs equal (up to float rounding) and the graph
    exportable; it may leave dead nodes behind (the caller removes them).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    default_options: ClassVar[dict[str, Any]] = {}
    # Passes that change the program's inputs are judged on the whole model, not on a site.
    changes_inputs: ClassVar[bool] = False
    # Whether the pass may rewrite a training step (`tuner.graph.nodes.is_training`): its rewrite
    # keeps forward, every parameter's gradient and the parameters as the trainable leaves. False by
    # default (fail closed): a pass must say it is safe, e.g. folding eval batch norm is not.
    train_safe: ClassVar[bool] = False

    def __init__(self, **options: Any) -> None:
        unknown = set(options) - set(self.default_options)
        if unknown:
            raise ValueError(f"{self.name}: unknown options {sorted(unknown)}")
        self.options = {**self.default_options, **options}
        # Places the pass would have matched but refused, each with why (e.g. a dynamic size
        # it cannot keep dynamic); filled by find_sites, reported with the tuning decisions.
        self.refusals: list[str] = []

    def refuse(self, reason: str) -> None:
        if reason not in self.refusals:
            self.refusals.append(reason)

    @abstractmethod
    def find_sites(self, gm: fx.GraphModule) -> list[Site]: ...

    @abstractmethod
    def rewrite(self, gm: fx.GraphModule, site: Site) -> None: ...

    def input_packer(self, gm: fx.GraphModule, site: Site) -> Callable[[tuple], tuple] | None:
        """Passes that change the program's inputs return how to turn old inputs into new ones."""
        return None

    @classmethod
    def version(cls) -> str:
        """Name plus a digest of the code the pass runs (its module and the fxtune modules it
        imports, transitively) and of the torch version: a change in any of them, a shared helper
        included, measures the pass afresh instead of reusing stale cached decisions."""
        return f"{cls.name}@{_code_digest(cls.__module__, torch.__version__)[:10]}"

    @staticmethod
    def nodes_of(gm: fx.GraphModule, site: Site) -> list[fx.Node]:
        by_name = {n.name: n for n in gm.graph.nodes}
        try:
            return [by_name[name] for name in site.nodes]
        except KeyError as exc:
            raise LookupError(f"site {site.id} refers to missing node {exc}") from None
