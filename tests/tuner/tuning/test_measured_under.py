"""What was measured under what, and the fallback a runtime config records (no tuning run)."""

from __future__ import annotations

from tests.service.fakes import config as fake_config
from tuner.contract.config import Figures, PassStep, TunedConfig, Verdict
from tuner.tuning.measured_under import fallback_of, measured_under

STEPS = [PassStep(pass_name="fuse_horizontal_linear", sites=["s1"])]


def fig(name: str, backend: str, speedup: float, verdict: Verdict = Verdict.FASTER) -> Figures:
    passes = STEPS if "+" in name else []
    return Figures(name=name, backend=backend, passes=passes, speedup=speedup, verdict=verdict)


FIGURES = [
    fig("inductor", "inductor", 1.20),
    fig("openvino", "openvino", 1.60),
    fig("eager + tuned passes", "eager", 1.10),
    fig("inductor + tuned passes", "inductor", 1.35),
    fig("openvino + tuned passes", "openvino", 1.40),
    fig("onnxruntime", "onnxruntime", 0.10, Verdict.SLOWER),
    fig("compile", "compile", 0.0, Verdict.NOT_MEASURED),
]


def test_each_backend_alone_and_with_passes_is_listed_eager_first() -> None:
    under = measured_under(FIGURES, "openvino", has_sites=True)
    rows = {r.backend: r for r in under.backends}
    assert under.backends[0].backend == "eager"
    assert (rows["eager"].alone, rows["eager"].tuned_passes) == (1.0, 1.1)
    assert (rows["openvino"].alone, rows["openvino"].tuned_passes) == (1.6, 1.4)
    assert rows["onnxruntime"].alone == 0.1 and rows["onnxruntime"].tuned_passes is None
    assert rows["compile"].alone is None  # not measured is not a figure
    assert under.site_backend == "eager"


def test_passes_won_under_eager_but_lost_under_the_shipped_backend_are_noted() -> None:
    notes = measured_under(FIGURES, "openvino", has_sites=True).notes
    assert "openvino ships" in notes[0]
    lost = [n for n in notes if "did not pay" in n]
    assert len(lost) == 1 and "under openvino" in lost[0] and "in eager: 1.100x" in lost[0]
    assert not any("under inductor" in n for n in notes)  # they paid there


def test_the_fallback_is_the_fastest_candidate_that_needs_no_runtime() -> None:
    fallback = fallback_of(FIGURES)
    assert (fallback.name, fallback.backend, fallback.speedup) == (
        "inductor + tuned passes",
        "inductor",
        1.35,
    )
    slower = fig("inductor", "inductor", 0.9, Verdict.SLOWER)
    nothing = fallback_of([fig("openvino", "openvino", 1.6), slower])
    assert (nothing.name, nothing.backend, nothing.passes) == ("original", "eager", [])


def test_configs_of_older_schemas_still_load_with_the_new_fields_defaulted() -> None:
    old = TunedConfig.model_validate(fake_config())  # schema 1, as the service's fakes write
    assert old.runtime is None and old.fallback is None
    assert old.measured_under.site_backend == "eager" and old.measured_under.backends == []
    assert old.candidates[0].build_s is None
