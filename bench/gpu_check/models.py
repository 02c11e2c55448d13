"""The models `make gpu-check` tunes, each built on the machine that runs the check.

A `.pt2` saved under another torch need not load (the GPU host ships torch 2.11), so every
model is exported where it is checked, by the same builders the examples, `make bench` and the
tests use. Each entry also draws fresh inputs of the example's shapes, so the shipped program is
compared with the original on inputs neither was tuned on.

Entries are named by import path ("module:function", see `resolve`), which is what a per-model
child process receives: a test can add an entry of its own (one that kills its process) without
touching this registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # torch is imported where it is used: without it the check still reports
    import torch

Inputs = tuple["torch.Tensor", ...]


@dataclass(frozen=True)
class Built:
    """An exported model on disk and fresh input sets to compare the shipped program on."""

    path: Path
    trials: list[Inputs]


@dataclass(frozen=True)
class ModelSpec:
    """One row of the check: how to build the model, and how to tune it.

    `budget_s` is the tuning budget on a GPU (`fxtune tune --budget-s`); it is what keeps the
    whole check under 8 minutes on an H100, so the headline model gets the most."""

    name: str
    build: Callable[[Path], Built] = field(repr=False)
    budget_s: float
    mode: Literal["infer", "train"] = "infer"
    tune_args: tuple[str, ...] = ()


def _like(inputs: Inputs, seed: int) -> Inputs:
    """Fresh tensors shaped as `inputs`: floats from a normal, integers uniform in [0, max]
    (token ids stay in the vocabulary, a 0/1 mask stays a mask)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if x.is_floating_point():
            out.append(torch.randn(x.shape, generator=g, dtype=x.dtype))
        else:
            high = int(x.max()) + 1 if x.numel() else 1
            out.append(torch.randint(0, high, x.shape, generator=g, dtype=x.dtype))
    return tuple(out)


def _example(name: str, out_dir: Path) -> Built:
    from examples.models import EXAMPLES
    from tuner.graph.capture import export_module, save_program

    example = EXAMPLES[name]()
    path = save_program(
        export_module(example.module, example.example_inputs), out_dir / f"{name}.pt2"
    )
    return Built(path, [example.fresh_inputs(seed) for seed in (101, 102)])


def recsys(out_dir: Path) -> Built:
    """The headline: the recsys example at batch 256 (32 embedding bags, 4 towers)."""
    return _example("recsys", out_dir)


def cnn(out_dir: Path) -> Built:
    """Bias-free convs with batch norms: fold_conv_bn's CUDA path."""
    return _example("cnn", out_dir)


def transformer(out_dir: Path) -> Built:
    return _example("transformer", out_dir)


def _held_out(name: str, out_dir: Path) -> Built:
    from bench.held_out import build_held_out
    from tuner.graph.capture import example_inputs
    from tuner.loading.load import load_program

    path = build_held_out(out_dir, [name])[name]
    inputs = example_inputs(load_program(path))
    return Built(path, [_like(inputs, seed) for seed in (101, 102)])


def bert_mini(out_dir: Path) -> Built:
    """transformers' BERT (4 layers, hidden 256), random weights: CPU-baked constants."""
    return _held_out("bert_mini", out_dir)


def vit_tiny(out_dir: Path) -> Built:
    return _held_out("vit_tiny", out_dir)


def mlp_dynamic(out_dir: Path) -> Built:
    """The MLP-with-split exported with a dynamic batch (2 to 4096); compared at three batches."""
    from examples.dynamic import mlp_inputs, mlp_split
    from tuner.graph.capture import save_program

    _, program = mlp_split()
    path = save_program(program, out_dir / "mlp_dynamic.pt2")
    return Built(path, [mlp_inputs(batch, seed=101) for batch in (2, 32, 512)])


def transformer_train(out_dir: Path) -> Built:
    """A training step: the transformer exported in train mode (dropout live)."""
    from examples.training import TRAINING, export_for_training
    from tuner.graph.capture import save_program

    example = TRAINING["transformer"]()
    path = save_program(export_for_training(example), out_dir / "transformer_train.pt2")
    return Built(path, [example.fresh_inputs(seed) for seed in (101, 102)])


# In the order they run: the headline first, so a deadline cuts the least telling rows.
REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("recsys", recsys, budget_s=45),
        ModelSpec("cnn", cnn, budget_s=15),
        ModelSpec("transformer", transformer, budget_s=15),
        ModelSpec("bert_mini", bert_mini, budget_s=20),
        ModelSpec("vit_tiny", vit_tiny, budget_s=20),
        ModelSpec("mlp_dynamic", mlp_dynamic, budget_s=15),
        ModelSpec(
            "transformer_train",
            transformer_train,
            budget_s=15,
            mode="train",
            tune_args=("--mode", "train", "--optimizer", "sgd"),
        ),
    )
}


def path_of(name: str) -> str:
    """A registry entry's import path, as a child process resolves it."""
    return f"{__name__}:REGISTRY.{name}"


def resolve(path: str) -> ModelSpec:
    """`module:attr[.attr...]` to the `ModelSpec` it names (a spec, or a function returning one)."""
    module_name, _, attrs = path.partition(":")
    if not attrs:
        raise ValueError(f"expected module:attribute, got {path!r}")
    obj: object = importlib.import_module(module_name)
    for attr in attrs.split("."):
        obj = obj[attr] if isinstance(obj, dict) else getattr(obj, attr)
    if callable(obj) and not isinstance(obj, ModelSpec):
        obj = obj()
    if not isinstance(obj, ModelSpec):
        raise TypeError(f"{path} is a {type(obj).__name__}, not a ModelSpec")
    return obj
