"""Calling a runtime's compiled model as the program it was built from is called.

OpenVINO and ONNX Runtime take and give numpy arrays, in the flat order of the program's
inputs and outputs. `RuntimeRunner` takes the program's positional tensors, checks each
against what the artifact was built for (count, dtype, rank, static sizes: never a wrong
answer from an input of another shape), and gives back the program's output structure (its
pytree spec) of torch tensors. One call at a time: a runtime's request object is not to be
shared between threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tuner.contract.errors import FxtuneError
from tuner.host.torch_compat import pytree

# Positional numpy arrays in, the flat outputs out.
FlatCall = Callable[[list[np.ndarray]], Sequence[np.ndarray]]


@dataclass(frozen=True)
class InputSig:
    """One input as the artifact declares it: its dtype and sizes (None: dynamic)."""

    name: str
    dtype: np.dtype
    dims: tuple[int | None, ...]

    def describe(self) -> str:
        sizes = ", ".join("?" if d is None else str(d) for d in self.dims)
        return f"{self.name} {self.dtype}[{sizes}]"


class InputRefused(FxtuneError, ValueError):
    """An input the runtime's artifact was not built for."""


class NotForRuntime(FxtuneError, ValueError):
    """A program (or an input or output of it) a runtime backend is not offered (says why)."""


def _array(i: int, value: Any, sig: InputSig) -> np.ndarray:
    if not isinstance(value, torch.Tensor):
        raise InputRefused(f"input {i} must be a tensor, got {type(value).__name__}")
    if value.device.type != "cpu":
        raise InputRefused(f"input {i} is on {value.device}; the runtime runs on the CPU")
    array = value.detach().numpy()  # bfloat16 and friends raise here: numpy has no such type
    if array.dtype != sig.dtype:
        raise InputRefused(f"input {i} is {array.dtype}; the artifact takes {sig.describe()}")
    if array.ndim != len(sig.dims) or any(
        want is not None and got != want for got, want in zip(array.shape, sig.dims, strict=True)
    ):
        raise InputRefused(
            f"input {i} has shape {tuple(array.shape)}; the artifact takes {sig.describe()}"
        )
    return np.ascontiguousarray(array)


class RuntimeRunner:
    """`runner(*inputs)` -> the program's outputs, computed by a runtime (`call`)."""

    def __init__(
        self, runtime: str, call: FlatCall, inputs: Sequence[InputSig], out_spec: Any
    ) -> None:
        self.runtime = runtime
        self._call = call
        self.inputs = tuple(inputs)
        self.out_spec = out_spec
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.inputs):
            raise InputRefused(
                f"{self.runtime}'s artifact takes {len(self.inputs)} inputs, got {len(args)}"
            )
        pairs = enumerate(zip(args, self.inputs, strict=True))
        arrays = [_array(i, a, sig) for i, (a, sig) in pairs]
        with self._lock:
            flat = self._call(arrays)
        outs = [torch.from_numpy(np.asarray(o)) for o in flat]
        return pytree.tree_unflatten(outs, self.out_spec)


def out_spec_of(module: torch.nn.Module) -> Any:
    """The output structure of an unlifted program's module (`program.module()`, or a pass's
    rewrite of it): what a runtime's flat outputs are put back into."""
    spec = getattr(module, "_out_spec", None)
    if spec is None:
        raise ValueError("the module records no output structure (not an exported program's)")
    return spec
