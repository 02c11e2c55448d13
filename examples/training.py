"""Training variants of the example models, for `fxtune tune --mode train`.

Exporting a model for training: put the module in train mode and export it with its sample
inputs, as for inference:

    model.train()
    program = torch.export.export(model, example_inputs, strict=False)
    torch.export.save(program, "model_train.pt2")

A program exported from a train-mode module keeps batch norm in its training form (batch
statistics, running statistics updated in place) and dropout live (`aten.dropout(x, p, True)`);
one exported in eval mode has both frozen, and training it would train another model. The
unlifted module (`torch.export.load(...).module()`) has the original's parameters, with their
state_dict names, as `nn.Parameter`s that require grad, so `loss.backward()` and an optimizer
over `module.parameters()` train it with plain torch.

The loss fxtune times is the program's own when it returns a scalar (a model that computes its
loss inside), else the mean of each floating output, summed (`tuner.training.step.loss_of`): what
matters for timing is that the backward covers every output.

`python -m examples.training OUT_DIR` writes `<name>_train.pt2` for each example.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.export import ExportedProgram

from examples.models import EXAMPLES, Example, cnn, recsys, transformer
from tuner.graph.capture import save_program


def _train(example: Example) -> Example:
    example.module.train()
    example.name += "_train"
    example.description += "; in train mode (batch norm on batch statistics, dropout live)"
    return example


def recsys_train(batch: int = 64, num_sparse: int = 32) -> Example:
    """The recsys example in train mode: dropout before the towers is live."""
    return _train(recsys(batch, num_sparse))


def cnn_train(batch: int = 8) -> Example:
    """The CNN in train mode: its batch norms use batch statistics and update running ones."""
    return _train(cnn(batch))


def transformer_train(batch: int = 8, seq: int = 64) -> Example:
    """The transformer in train mode: dropout after attention and the MLP is live."""
    return _train(transformer(batch, seq))


TRAINING: dict[str, Callable[[], Example]] = {
    "recsys": recsys_train,
    "cnn": cnn_train,
    "transformer": transformer_train,
}
assert set(TRAINING) == set(EXAMPLES)


def export_for_training(example: Example) -> ExportedProgram:
    """torch.export of the module in train mode, its sample inputs stored in the program."""
    example.module.train()
    return torch.export.export(example.module, example.example_inputs, strict=False)


def build(name: str, out_dir: Path | str) -> Path:
    example = TRAINING[name]()
    return save_program(export_for_training(example), Path(out_dir) / f"{example.name}.pt2")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m examples.training OUT_DIR", file=sys.stderr)
        return 2
    for name in TRAINING:
        print(f"{name}: {build(name, args[0])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
