"""Model fingerprints: what a deployment uses to find the tuned config for the model it holds.

Structure, shapes and dtypes only, never weights: retraining a model keeps its fingerprint, so a
config tuned for one checkpoint serves the next.
"""

from __future__ import annotations

import hashlib

from torch import fx
from torch.export import ExportedProgram

from tuner.capture import to_graph_module
from tuner.sites import structural_id


def graph_fingerprint(gm: fx.GraphModule) -> str:
    nodes = list(gm.graph.nodes)
    digest = structural_id("model", nodes)
    return hashlib.sha256(f"fxtune-fp-v1:{digest}".encode()).hexdigest()[:32]


def model_fingerprint(program: ExportedProgram) -> str:
    return graph_fingerprint(to_graph_module(program))
