"""Counting dispatched ATen ops, and making inductor's CPU kernels visible to the profiler."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tuner.host.torch_compat import private, python_dispatch


class OpCounter(python_dispatch.TorchDispatchMode):  # torch is checked when this module loads
    """Counts every op that reaches the Python dispatch key, by overload name.

    Composite ops (`aten.linear`) arrive decomposed (`t`, `addmm`): that is what runs. With
    `ignore_compile_internals`, torch.compile'd code runs compiled under the mode (its generated
    kernels are not ops; only the ATen calls it makes are counted); without it dynamo falls back
    to eager for good, which would both miscount and spoil every later run.
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def count_dispatched_ops(fn: Callable[[], Any]) -> Counter[str]:
    """ATen calls made by one call of `fn`, by overload (`aten.addmm.default`)."""
    counter = OpCounter()
    with counter:
        fn()
    return counter.counts


@contextmanager
def inductor_kernel_ranges() -> Iterator[None]:
    """Compile inside this to get one profiler range per generated C++ kernel.

    Inductor emits the ranges only when `cpp.enable_kernel_profile` is on at code generation, so
    it has to cover the first call of the compiled function, not the profiling.
    """
    config = private("torch._inductor.config")
    with config.patch({"cpp.enable_kernel_profile": True}):
        yield
