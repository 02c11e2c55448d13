"""What a caller asks of a tuning run (`TuneOptions`), checked when it is made."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from tuner.contract.config import Mode
from tuner.contract.device import CPU, Device
from tuner.contract.errors import InputError
from tuner.contract.training import OPTIMIZER_NAMES
from tuner.host.job_caches import DECISIONS
from tuner.host.load import CoreLoad

if TYPE_CHECKING:
    from tuner.backends.isolation import Children

# The options that only some modes take, and those modes (the rest apply to every mode).
MODE_ONLY: dict[str, tuple[Mode, ...]] = {"optimizer": ("train",)}


@dataclass
class TuneOptions:
    device: Device | str = CPU  # parsed in __post_init__: the run sees only a Device
    budget_s: float = 120.0
    # time.monotonic() when the budget began (`fxtune tune` gives its own start, so that
    # loading the program counts); None: when tuning starts.
    started: float | None = None
    epsilon: float = 0.02
    backends: list[str] | None = None  # default: every backend available for the device
    passes: list[str] | None = None  # default: every registered pass
    cache_path: Path | None = None
    # Where the run's new decisions and compile times go (`decisions.json`, `compile_times.json`
    # in this folder); the stores at `cache_path` are then only read. A worker's jobs: the worker
    # checks what a job recorded before merging it into the store every job reads.
    cache_out: Path | None = None
    workdir: Path | None = None  # where compiled packages go; a temporary folder by default
    # CPU threads for the whole run (and the hardware key). On a shared machine fewer threads
    # than cores keeps other processes from stalling multi-threaded kernels mid-measurement.
    threads: int | None = None
    # Other work on the cores, which scales compile estimates; None: sampled as the run
    # starts (`tuner.host.load`). Given, it makes a run's plan independent of the machine.
    load: CoreLoad | None = None
    whole_model_budget_s: float = 6.0
    site_budget_s: float = 1.5
    # Sizes to tune a dynamic program at, per dynamic dim ({"batch": [1, 32, 512]}); None:
    # each dim's minimum, the example and a large value (tuner.graph.sizes.default_sizes).
    sizes: dict[str, list[int]] | None = None
    # "infer" tunes the forward; "train" a training step (tuner.tuning.train): forward, loss,
    # backward and, with `optimizer` (tuner.training.step.OPTIMIZERS), one optimizer step.
    # Each mode's step kind is in `tuner.tuning.modes.STEP_KINDS`.
    mode: Mode = "infer"
    optimizer: str | None = None
    # Build each torch.compile / CUDA-graph candidate once in a child process first, so one
    # that crashes (a segfault, a CUDA error) is recorded as such and tuning goes on; None: on
    # CUDA only, where such crashes were seen and a compile costs more than the child.
    isolate_compiles: bool | None = None
    # Where compile children come from (`tuner.backends.isolation.Children`); `tuning_session`
    # makes one for the run (started ahead where compiles are isolated). None: one per compile.
    children: Children | None = None

    @property
    def new_decisions_path(self) -> Path | None:
        return None if self.cache_out is None else self.cache_out / DECISIONS

    @property
    def isolates(self) -> bool:
        """Whether compiled candidates are built in a child first (`isolate_compiles`
        resolved: on CUDA unless said otherwise)."""
        if self.isolate_compiles is None:
            return self.device.kind == "cuda"  # type: ignore[union-attr]  # parsed below
        return self.isolate_compiles

    def __post_init__(self) -> None:
        self.device = Device.parse(self.device)
        modes = get_args(Mode)
        if self.mode not in modes:
            raise InputError(f"unknown mode {self.mode!r}; known: {', '.join(modes)}")
        for name, takes in MODE_ONLY.items():
            if getattr(self, name) is not None and self.mode not in takes:
                raise InputError(f"--{name} applies to --mode {' or '.join(takes)} only")
        if self.optimizer is not None and self.optimizer not in OPTIMIZER_NAMES:
            known = ", ".join(OPTIMIZER_NAMES)
            raise InputError(f"unknown optimizer {self.optimizer!r}; known: {known}")
