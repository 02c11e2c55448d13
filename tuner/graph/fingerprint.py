"""Model fingerprints: what a deployment uses to find the tuned config for the model it holds.

Structure, shapes and dtypes only, never weights: retraining a model keeps its fingerprint, so a
config tuned for one checkpoint serves the next.
"""

from __future__ import annotations

import hashlib

from torch import fx
from torch.export import ExportedProgram

from tuner.graph.capture import to_graph_module
from tuner.graph.shapes import spec_of
from tuner.graph.sites import structural_id


def graph_fingerprint(gm: fx.GraphModule) -> str:
    """Static programs: as in fxtune 1 (their configs stay findable). Dynamic programs: the
    symbols under their dimension names plus every range, so one fingerprint serves every size
    in range, and a re-export with another range is another model."""
    nodes = list(gm.graph.nodes)
    spec = spec_of(gm)
    if spec is None or not spec.is_dynamic:
        digest = structural_id("model", nodes)
        return hashlib.sha256(f"fxtune-fp-v1:{digest}".encode()).hexdigest()[:32]
    digest = structural_id("model", nodes, rename=spec.names)
    ranges = ";".join(f"{d.name}:{d.min}:{d.max}" for d in spec.dims)
    return hashlib.sha256(f"fxtune-fp-v2:{digest}:{ranges}".encode()).hexdigest()[:32]


def model_fingerprint(program: ExportedProgram) -> str:
    return graph_fingerprint(to_graph_module(program))
