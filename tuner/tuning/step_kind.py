"""What is tuned, as one strategy object: the forward (`tuner.tuning.inference.InferenceStep`) or
a training step (`tuner.tuning.train.TrainingStep`); `tuner.tuning.modes` maps a mode to its kind.

The pipeline (`tuner.tuning.tuner.Tuner`) is the same for both: capture, site search, candidates,
judge, choose, verify, config. A step kind answers only what differs: which passes apply, how the
program is captured, what the original's timed call is and what a built candidate's is, how a
candidate is built and checked before it is timed, how the choice is verified, and the config's
fields for the mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import torch
from torch import fx
from torch.export import ExportedProgram

from tuner.backends.registry import Built
from tuner.contract.config import Figures, Mode, PassStep, TunedConfig
from tuner.graph.capture import Inputs
from tuner.search.site_search import Progress, SiteRun
from tuner.tuning.candidates import Candidate
from tuner.tuning.run import Captured, TuningRun, Verified


class StepKind(Protocol):
    mode: ClassVar[Mode]
    # What one run of a site is in the per-site search (`tuner.search.site_search`).
    site_run: ClassVar[SiteRun]
    # How a skipped compile is described ("compiling", "compiling the training step").
    compiling: ClassVar[str]

    def __init__(self, run: TuningRun) -> None: ...

    def passes(self) -> list[str]:
        """The passes this run may apply (raises InputError for one asked for that cannot)."""
        ...

    def capture(self, program: ExportedProgram, say: Progress) -> Captured:
        """The program on the device, with its example inputs (and sizes, `run.points`)."""
        ...

    def baseline(self, gm0: fx.GraphModule) -> Callable[..., Any]:
        """The original's timed call, on the inputs: what every candidate is compared with."""
        ...

    def timed_call(self, runner: Any) -> Callable[..., Any]:
        """A built candidate's timed call, on its (packed) inputs (`runner`: what `build`
        made, a callable or a `tuner.training.step.TrainRunner`)."""
        ...

    def before_search(self, say: Progress) -> None:
        """Say (and note) what the site search times for this kind."""
        ...

    def candidates(
        self, gm0: fx.GraphModule, inputs: Inputs, greedy: list[PassStep], every: list[str]
    ) -> list[Candidate]:
        """Whole-model candidates: the plain peers first, then the rest. `greedy` is what the
        site search kept, `every` the passes to apply blind."""
        ...

    def compile_estimate(self, cand: Candidate) -> float | None:
        """Seconds its compile is expected to take (None: unknown, so it is started)."""
        ...

    def build(self, cand: Candidate, left: float) -> Built:
        """The candidate's runner (its compile made and recorded here), within `left` s."""
        ...

    def check_trials(self, inputs: Inputs) -> list[Inputs]:
        """The input sets `check` runs a candidate on, from `inputs` (seeded: the same every
        time, so the run's reference outputs on them are made once; a budget plans the check
        by them)."""
        ...

    def reference_call_s(self, baseline: Callable[..., Any], inputs: Inputs) -> float | None:
        """The original's seconds per call on `inputs`, read as its checks' reference outputs
        there are made (once per run: the first check there then pays its candidate's calls
        only); None where its checks keep no such reference."""
        ...

    def check(
        self,
        gm0: fx.GraphModule,
        inputs: Inputs,
        runner: Any,
        pack: Callable[[Inputs], Inputs],
    ) -> str | None:
        """Why the built runner does not do what the original does (None: it does), on
        `inputs` and fresh ones; checked before any timing."""
        ...

    def verify(
        self, program: ExportedProgram, captured: Captured, fig: Figures, chosen: Candidate
    ) -> Verified:
        """The choice replayed from the original and checked, or the original with the reason."""
        ...

    def finish(self, config: TunedConfig, captured: Captured, verified: Verified) -> TunedConfig:
        """The config with the mode's own fields."""
        ...

    @classmethod
    def profiled_baseline(
        cls, module: torch.nn.Module, config: TunedConfig, device: torch.device
    ) -> Callable[..., Any]:
        """What a report profiles as the original: what this kind timed as its baseline."""
        ...
