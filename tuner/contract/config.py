"""The tuned config: the JSON that deployments, the service and the dashboard read (a contract).

Importable without torch (the service's schemas and a deployment's config check use it);
replaying a config on a program is `tuner.deploy.replay`.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

# 2 added (all defaulted, so version 1 configs still load): `shapes` (the dynamic dimensions the
# program serves), `sizes` (per-size figures), `refusals`, and per-size figures on decisions.
# 3 added (defaulted: older configs read as inference configs): `mode` and `training`.
# 4 added `buckets` (defaulted to none: one decision set for every size, as in 1 to 3).
# 5 added (defaulted: older configs read as before) `runtime` (the OpenVINO or ONNX Runtime
# artifact a runtime backend ships), `fallback` (what runs where that runtime is not installed)
# and `measured_under` (which backend each decision was measured under).
# 6 added `settings` (defaulted to none: inductor's defaults) on figures and the fallback: the
# named inductor settings an inductor candidate was built with (`InductorSettings`).
SCHEMA_VERSION = 6
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)

# Inductor's settings, by name only (`tuner.backends.inductor_settings` holds their values), so
# a config never carries values for inductor's config.
InductorSettings = Literal["max-autotune", "freezing", "concat-linear"]

# A 95% interval of a speedup; a bound is None where too few rounds fitted to close it.
Interval = tuple[float | None, float | None]

Mode = Literal["infer", "train"]


class Verdict(StrEnum):
    """What a measurement concluded. A `StrEnum`: each member is its JSON string, so configs
    written when this was a `Literal` load unchanged, and readers that compare strings (the
    service, the dashboard) keep working."""

    FASTER = "faster"
    SLOWER = "slower"
    WITHIN_NOISE = "within noise"
    WRONG_OUTPUTS = "wrong outputs"
    FAILED_TO_RUN = "failed to run"
    CRASHED = "crashed"
    NOT_MEASURED = "not measured"


class Refusal(BaseModel):
    """A place a pass would have matched but refused, and why (e.g. a dynamic size)."""

    pass_name: str = Field(alias="pass")
    reason: str

    model_config = {"populate_by_name": True, "frozen": True}


class SizeFigures(BaseModel):
    """One size the program was measured at: its dynamic sizes and the A/B figures there."""

    label: str  # "batch=32"
    sizes: dict[str, int]
    baseline_s: float | None = None
    candidate_s: float | None = None
    speedup: float | None = None
    ci: Interval | None = None
    rounds: int = 0
    verdict: Verdict = Verdict.NOT_MEASURED
    reason: str | None = None


class PassStep(BaseModel):
    """One pass, and the site ids it rewrites; replayed in order."""

    pass_name: str = Field(alias="pass")
    sites: list[str]

    model_config = {"populate_by_name": True}


class Measured(BaseModel):
    """An A/B timing summary (see `timing_fields`) and what was concluded from it."""

    baseline_s: float | None = None
    candidate_s: float | None = None
    speedup: float | None = None
    ci: Interval | None = None
    rounds: int = 0
    verdict: Verdict
    reason: str | None = None
    # Per size, for programs with dynamic dimensions tuned at several sizes; the fields above
    # are then the example size's figures and the verdict is the one across every size.
    per_size: list[SizeFigures] = Field(default_factory=list)


class SiteDecision(Measured):
    pass_name: str = Field(alias="pass")
    site_id: str
    summary: str
    count: int = 1  # identical sites in the model that share this decision
    accepted: bool
    cached: bool = False
    # Set when the site's baseline contradicted the whole model's time even when re-measured
    # (tuner.search.site_search): the decision was then not trusted. Added in schema 2 (defaulted).
    inconsistent: str | None = None
    # The share of the model's time its copies cover, by the node profile that ordered the
    # search (tuner.profiling.node_profile); None where not profiled. Informational and defaulted,
    # so configs of schema 4 without it still load.
    share: float | None = None

    model_config = {"populate_by_name": True}


class Figures(Measured):
    """A whole-model timing against the untouched original on the same inputs, interleaved."""

    name: str
    backend: str
    passes: list[PassStep]
    # Seconds its runner took to build in this run (a compile, a runtime's conversion and
    # load; None where nothing was built). Added in schema 5 (defaulted).
    build_s: float | None = None
    # Inductor's settings it was built with (backend "inductor" only; None: the defaults).
    settings: InductorSettings | None = None


class Verification(BaseModel):
    inputs: int
    max_abs_error: float | None
    max_rel_error: float | None
    passed: bool
    reason: str | None = None


class TrainingSetup(BaseModel):
    """What a training config's step is: the optimizer stepped (None: gradients only) and how
    the loss is taken from the outputs (`tuner.training.step.loss_of`)."""

    optimizer: str | None = None
    loss: str


class Bucket(BaseModel):
    """A contiguous range of one dynamic dimension and the decision that won at its sizes.

    The decision is one measured whole-model candidate (its backend and pass steps), chosen
    from the figures taken at the measured sizes inside the range (`measured`), or the original
    ("original", eager, no passes) where no candidate was faster there beyond noise.
    """

    dim: str  # the dynamic dimension's name ("batch")
    min: int
    max: int | None  # None: unbounded above, as the dimension is
    measured: list[int]  # the sizes of `dim` measured inside [min, max]
    name: str  # the candidate's name ("eager + every pass"; "original")
    backend: str
    passes: list[PassStep]
    per_size: list[SizeFigures] = Field(default_factory=list)  # the candidate's, at `measured`
    reason: str | None = None

    def contains(self, size: int) -> bool:
        return size >= self.min and (self.max is None or size <= self.max)

    def describe(self) -> str:
        top = "inf" if self.max is None else str(self.max)
        return f"{self.dim} in [{self.min}, {top}]"


class RuntimeArtifact(BaseModel):
    """The file a runtime backend ships (`backend` is "openvino" or "onnxruntime"): what was
    timed, as data (`tuner.backends.runtime_files`). `sha256` names the exact bytes, which the
    service stores and a deployment fetches and checks; None where none ships (`reason`)."""

    runtime: str
    version: str  # the runtime's version it was built and timed with
    format: str  # "onnx" | "openvino-ir-zip"
    sha256: str | None = None
    bytes: int | None = None
    reason: str | None = None


class Fallback(BaseModel):
    """What a deployment runs where the chosen runtime is not installed (or its artifact cannot
    be used): the fastest measured candidate that needs no runtime (the original if none was
    faster), replayed from its passes under its backend."""

    name: str
    backend: str
    passes: list[PassStep]
    speedup: float | None = None  # over the original, as measured in the run
    settings: InductorSettings | None = None


class PassesUnder(BaseModel):
    """How fxtune's passes fared under one backend: whole-model speedups over the original in
    eager, of the backend alone and with each pass set (None: not measured there)."""

    backend: str
    alone: float | None = None
    tuned_passes: float | None = None
    every_pass: float | None = None


class MeasuredUnder(BaseModel):
    """What was measured under what: the per-site decisions (`sites`) are timed with each site
    extracted and run in `site_backend` (eager); the whole-model choice is each candidate timed
    as it ships, under its own backend (`candidates`, summarised here per backend). `notes`
    says where a pass set that won under eager lost under the backend that ships, or the
    reverse."""

    site_backend: str = "eager"
    backends: list[PassesUnder] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class TunedConfig(BaseModel):
    schema_version: int = SCHEMA_VERSION
    # "train": tuned as a training step (forward, loss, backward, optimizer step); replaying it
    # applies only training-safe passes, keeping the parameters as the trainable leaves.
    mode: Mode = "infer"
    training: TrainingSetup | None = None
    model_fingerprint: str
    hardware: dict[str, Any]
    backend: str
    passes: list[PassStep]
    changes_inputs: bool = False
    # Per-site decisions; in a "train" config each site's times are its forward + backward
    # (`tuner.search.site_search.FORWARD_BACKWARD`), so `mode` says what was timed and no field is
    # added.
    sites: list[SiteDecision]
    candidates: list[Figures]
    whole_model: Figures
    verification: Verification
    tuning: dict[str, Any]
    # The dynamic dimensions (names, ranges) and per-input dims the tuned program serves
    # (`tuner.graph.shapes.ShapeSpec.to_dict`); empty dims for a static program.
    shapes: dict[str, Any] = Field(default_factory=dict)
    refusals: list[Refusal] = Field(default_factory=list)
    # Where winners differ by size: one decision per range of one dynamic dim, covering its
    # whole range (`tuner.search.buckets`). Empty: `backend` and `passes` serve every size.
    # When set, `backend`, `passes` and `whole_model` are the decision of the example size's bucket.
    buckets: list[Bucket] = Field(default_factory=list)
    # Set when `backend` is a runtime: its artifact, and what runs where it cannot.
    runtime: RuntimeArtifact | None = None
    fallback: Fallback | None = None
    measured_under: MeasuredUnder = Field(default_factory=MeasuredUnder)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> TunedConfig:
        return cls.model_validate_json(text)

    @classmethod
    def load(cls, path: Path | str) -> TunedConfig:
        return cls.from_json(Path(path).read_text())

    def save(self, path: Path | str) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path
