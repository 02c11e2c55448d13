"""Size buckets (issue 9): where the measured winner differs by size, each range of sizes gets
the decision that won inside it, and every tuned artifact picks the bucket per call.

The model is `x @ (W @ W)`; the planted `test_reassociate` pass computes `(x @ W) @ W`, which
on this CPU is many times faster at batch 2 and 32 and slower at batch 1024 (width 256: the
crossover is near batch 256). Everything is measured: the test asserts what the measurements
must give, not what they gave.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.export import Dim

from tests.tuner.client_helpers import FakeService, dropped_program, tuned_config
from tests.tuner.tuning_fixtures import (
    CHAIN_WIDTH,
    Associate,
    ChainNet,
    Reassociate,
    TwoChainNet,
    registered,
)
from tuner.backends import registry as backends
from tuner.contract.aoti_manifest import Expected, check_package
from tuner.contract.config import Figures, SizeFigures, TunedConfig
from tuner.deploy.client import CheckedInputs, FxtuneClientWarning, load_tuned
from tuner.deploy.dispatch import SizeDispatch
from tuner.graph.shapes import DynamicDim, ShapeSpec
from tuner.graph.sizes import SizePoint
from tuner.loading.load import load_program
from tuner.search.buckets import bucket_dim, plan_buckets, winner_at
from tuner.tuning.outputs import write_outputs
from tuner.tuning.tuner import TuneOptions, tune_program, tuning_session

SIZES = [2, 32, 1024]
TOL = {"atol": 1e-3, "rtol": 1e-4}


# ------------------------------------------------------------------------ the rule, on figures

SPEC = ShapeSpec(inputs=(("batch", 8),), dims=(DynamicDim("s0", "batch", 2, 4096, 32),))


def _points(*batches: int) -> list[SizePoint]:
    return [SizePoint(f"batch={b}", {"batch": b}, ()) for b in batches]


def _fig(name: str, **at: tuple[float, float, float, str]) -> Figures:
    """A candidate measured at sizes given as batch_N=(speedup, ci low, ci high, verdict)."""
    per_size = [
        SizeFigures(
            label=label.replace("_", "="), sizes={}, speedup=s, ci=(lo, hi), rounds=9, verdict=v
        )
        for label, (s, lo, hi, v) in at.items()
    ]
    return Figures(name=name, backend="eager", passes=[], verdict="faster", per_size=per_size)


def test_one_winner_everywhere_keeps_one_decision() -> None:
    figs = [
        _fig("a", batch_2=(3.0, 2.5, 3.5, "faster"), batch_512=(1.5, 1.4, 1.6, "faster")),
        _fig("b", batch_2=(1.2, 1.1, 1.3, "faster"), batch_512=(1.1, 1.05, 1.2, "faster")),
    ]
    assert plan_buckets(SPEC, _points(2, 512), figs, "a") == []


def test_a_difference_inside_the_chosen_ones_interval_does_not_split() -> None:
    """At 512 "b" measured 1.95x and the chosen "a" 1.93x [1.85, 2.0]: noise, one decision."""
    figs = [
        _fig("a", batch_2=(4.9, 4.5, 5.3, "faster"), batch_512=(1.93, 1.85, 2.0, "faster")),
        _fig("b", batch_2=(2.0, 1.9, 2.1, "faster"), batch_512=(1.95, 1.9, 2.0, "faster")),
    ]
    assert winner_at("batch=512", figs, ["a"]) == "a"
    assert winner_at("batch=512", figs, []) == "b"
    assert plan_buckets(SPEC, _points(2, 512), figs, "a") == []
    # Beyond a's interval, b wins at 512 and the sizes split.
    figs[1] = _fig("b", batch_2=(2.0, 1.9, 2.1, "faster"), batch_512=(2.5, 2.4, 2.6, "faster"))
    plans = plan_buckets(SPEC, _points(2, 512), figs, "a")
    assert [(p.min, p.max, p.winner, p.measured) for p in plans] == [
        (2, 32, "a", [2]),
        (33, 4096, "b", [512]),
    ]


def test_two_candidates_within_noise_of_each_other_do_not_alternate() -> None:
    """Nothing wins everywhere (the original is the run's choice); at 2 "a" is fastest, at 32
    "b" by less than a's interval: one bucket runs "a" at both, the original runs above."""
    figs = [
        _fig("a", batch_2=(5.0, 4.5, 5.5, "faster"), batch_32=(2.9, 2.6, 3.2, "faster")),
        _fig("b", batch_2=(4.8, 4.4, 5.2, "faster"), batch_32=(3.0, 2.8, 3.2, "faster")),
    ]
    figs[0].per_size.append(SizeFigures(label="batch=1024", sizes={}, verdict="slower"))
    plans = plan_buckets(SPEC, _points(2, 32, 1024), figs, "original")
    assert [(p.min, p.max, p.winner) for p in plans] == [(2, 181, "a"), (182, 4096, "original")]


def test_buckets_split_at_the_geometric_midpoint_and_cover_the_range() -> None:
    """Where no candidate beats the original beyond noise, the original is that size's winner."""
    figs = [
        _fig(
            "p",
            batch_2=(20.0, 10.0, 30.0, "faster"),
            batch_32=(3.0, 2.0, 4.0, "faster"),
            batch_1024=(0.6, 0.5, 0.7, "slower"),
        )
    ]
    plans = plan_buckets(SPEC, _points(32, 2, 1024), figs, "original")
    assert [(p.min, p.max, p.winner, p.measured) for p in plans] == [
        (2, 181, "p", [2, 32]),  # isqrt(32 * 1024) = 181
        (182, 4096, "original", [1024]),
    ]


def test_no_buckets_when_several_dims_vary_together() -> None:
    spec = ShapeSpec(
        inputs=(("batch", "seq"),),
        dims=(DynamicDim("s0", "batch", 2, 64, 4), DynamicDim("s1", "seq", 2, 32, 16)),
    )
    points = [
        SizePoint("a", {"batch": 4, "seq": 16}, ()),
        SizePoint("b", {"batch": 2, "seq": 8}, ()),
    ]
    assert bucket_dim(spec, points) is None
    assert bucket_dim(SPEC, _points(32, 2)) is not None


def test_configs_without_buckets_still_load() -> None:
    """A schema 2 config (no `buckets`) parses to an empty list: one decision for every size."""
    doc = tuned_config(dropped_program(), "remove_dropout", schema_version=2)
    doc.pop("buckets", None)
    assert TunedConfig.model_validate(doc).buckets == []


# ------------------------------------------------------------------- measured, end to end


def _inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor]:
    return (torch.randn(batch, CHAIN_WIDTH, generator=torch.Generator().manual_seed(seed)),)


@pytest.fixture(scope="module")
def chain() -> tuple[nn.Module, Any]:
    model = ChainNet().eval()
    batch = Dim("batch", min=2, max=4096)
    program = torch.export.export(
        model, _inputs(32), dynamic_shapes={"x": {0: batch}}, strict=False
    )
    return model, program


@pytest.fixture(scope="module")
def tuned(chain: tuple[nn.Module, Any], tmp_path_factory: Any) -> tuple[Any, Path]:
    _, program = chain
    out = tmp_path_factory.mktemp("buckets")
    options = TuneOptions(
        budget_s=30,
        backends=["eager"],
        passes=["test_reassociate"],
        cache_path=out / "cache.json",
        sizes={"batch": SIZES},
        workdir=out / "work",
        # One thread: on shared cores a two-thread matmul stalls for a scheduler slice (30 ms)
        # whenever its second thread is descheduled, and both sides then time the stall.
        threads=1,
    )
    with registered(Reassociate), tuning_session(options) as session:
        outcome = tune_program(program, session)
        write_outputs(outcome, out / "tuned.pt2", out / "report.json", profile=False)
    return outcome, out


def _edges(config: TunedConfig) -> list[tuple[int, int]]:
    """(batch, bucket index) at both ends of every bucket and at the sizes measured in it."""
    out = []
    for k, b in enumerate(config.buckets):
        out += [(size, k) for size in sorted({b.min, b.max or 4096, *b.measured})]
    return out


@pytest.mark.slow
def test_small_and_large_batches_get_their_own_measured_decisions(
    tuned: tuple[Any, Path],
) -> None:
    """Batch 2 (the rewrite is ~20x faster there) and batch 1024 (no faster, truly ~0.6x) end
    in different buckets; batch 32 (~3x) goes with batch 2 unless the shared cores hid its
    gain; whichever, each bucket holds what won at the sizes inside it."""
    _, out = tuned
    config = TunedConfig.model_validate(json.loads((out / "report.json").read_text())["config"])
    buckets = config.buckets
    assert len(buckets) == 2, config.tuning["buckets"]
    small, large = buckets
    assert small.contains(2) and [s.pass_name for s in small.passes] == ["test_reassociate"]
    assert large.contains(1024) and (large.name, large.passes) == ("original", [])
    # The documented rule: the buckets tile [2, 4096], split at the geometric midpoint of the
    # measured sizes on either side of the boundary.
    assert (small.dim, small.min, large.max) == ("batch", 2, 4096)
    assert small.max == math.isqrt(small.measured[-1] * large.measured[0])
    assert large.min == small.max + 1
    assert sorted(small.measured + large.measured) == sorted(SIZES)
    # The small bucket's decision was faster, beyond noise, at each of its sizes...
    assert [f.sizes["batch"] for f in small.per_size] == small.measured
    for f in small.per_size:
        assert f.verdict == "faster" and f.ci is not None and f.ci[0] is not None
        assert 1.02 < f.ci[0] <= f.speedup
    # ...and no candidate was, at the large bucket's sizes (measured there too).
    for cand in config.candidates:
        at_large = [f for f in cand.per_size if f.sizes["batch"] in large.measured]
        assert len(at_large) == len(large.measured)
        assert all(f.verdict != "faster" for f in at_large)
    # The headline figures are the example size's (batch 32) bucket.
    head = small if small.contains(32) else large
    assert (config.whole_model.name, config.passes) == (head.name, head.passes)
    if head is small:  # its verdict is over the sizes it serves, not over the large bucket's
        assert config.whole_model.verdict == "faster" and "size buckets" in (
            config.whole_model.reason or ""
        )
    assert config.verification.passed
    assert "2 buckets" in config.tuning["buckets"]
    # The dispatching program's export was timed, so the next run prices it from this machine.
    times = json.loads((out / "compile_times.json").read_text())
    assert [k for k in times if k.endswith("::dispatch-export")], times


def _original_at(model: nn.Module, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = _inputs(batch, seed=batch)
    with torch.no_grad():
        return x[0], model(*x)


@pytest.mark.slow
def test_the_tuned_program_dispatches_by_size_and_keeps_the_range(
    chain: tuple[nn.Module, Any], tuned: tuple[Any, Path]
) -> None:
    model, _ = chain
    outcome, out = tuned
    loaded = load_program(out / "tuned.pt2")  # fxtune's own loader accepts the dispatch
    conds = [
        n for n in loaded.graph.nodes if n.target is torch.ops.higher_order.cond
    ]  # the bucket choice is inside the program
    assert len(conds) == 1
    module = loaded.module()
    for batch, _ in _edges(outcome.config):
        x, want = _original_at(model, batch)
        torch.testing.assert_close(module(x), want, **TOL)
    with pytest.raises(AssertionError, match=r"<= 4096"):
        module(*_inputs(4097))


@pytest.mark.slow
def test_when_every_bucket_chose_inductor_one_package_holds_the_dispatch(
    chain: tuple[nn.Module, Any], tuned: tuple[Any, Path], tmp_path: Path
) -> None:
    """`tuned.aoti.pt2` when every bucket chose inductor: the dispatching program compiled
    ahead of time, `torch.cond` and all, checked against the original before it ships; it
    serves each bucket and refuses sizes outside the range. (The run above is eager-only to
    stay fast, so its buckets are relabelled inductor here to take that path of the writer.)"""
    model, _ = chain
    outcome, _ = tuned
    _relabelled_outputs(outcome, [True, True], tmp_path, ["tuned.aoti.pt2"] * 2)
    _serves_the_range(model, outcome, tmp_path / "tuned.aoti.pt2")


@pytest.mark.slow
def test_when_only_the_example_bucket_chose_inductor_its_package_ships(
    chain: tuple[nn.Module, Any], tuned: tuple[Any, Path], tmp_path: Path
) -> None:
    """Mixed buckets: the example size's bucket's own package (built for the whole range, so
    right everywhere) is `tuned.aoti.pt2`; the eager bucket has none; nothing compiles the two
    together."""
    model, _ = chain
    outcome, _ = tuned
    _relabelled_outputs(outcome, [True, False], tmp_path, ["tuned.aoti.pt2", None])
    _serves_the_range(model, outcome, tmp_path / "tuned.aoti.pt2")


def _relabelled_outputs(
    outcome: Any, inductor: list[bool], out: Path, expected: list[str | None]
) -> None:
    """write_outputs with the buckets whose `inductor` is True relabelled inductor (the tuning
    run here is eager-only to stay fast); checks which packages it lists."""
    assert [b.bucket.contains(32) for b in outcome.buckets] == [True, False]  # the example
    buckets = [
        dataclasses.replace(b, bucket=b.bucket.model_copy(update={"backend": "inductor"}))
        if relabel
        else b
        for b, relabel in zip(outcome.buckets, inductor, strict=True)
    ]
    relabelled = dataclasses.replace(outcome, buckets=buckets)
    doc = write_outputs(relabelled, out / "tuned.pt2", out / "report.json", profile=False)
    artifacts = doc["artifacts"]
    assert artifacts["aoti"] == "tuned.aoti.pt2" and artifacts["aoti_max_abs_error"] < 1e-3
    assert [e["aoti"] for e in artifacts["buckets"]] == expected
    assert "aoti_refused" not in artifacts
    # Each real package passes the service's check of what a worker sends (manifest, members).
    shipped = Expected(outcome.config.model_fingerprint, "cpu")
    for rel in {artifacts["aoti"], *(e for e in expected if e)}:
        assert check_package(out / rel, shipped)["device"] == "cpu"


def _serves_the_range(model: nn.Module, outcome: Any, path: Path) -> None:
    package = backends.load_aoti(path)
    for batch, _ in _edges(outcome.config):
        x, want = _original_at(model, batch)
        torch.testing.assert_close(package(x), want, **TOL)
    for batch, why in ((1, "too small"), (4097, "too large")):
        with pytest.raises(RuntimeError, match=why):
            package(*_inputs(batch))


@pytest.mark.slow
def test_load_tuned_builds_each_bucket_once_and_picks_per_call(
    chain: tuple[nn.Module, Any],
    tuned: tuple[Any, Path],
    config_service: tuple[str, FakeService],
    tmp_path: Path,
) -> None:
    model, program = chain
    outcome, _ = tuned
    url, fake = config_service
    fake.configs[outcome.config.model_fingerprint] = outcome.config.model_dump(by_alias=True)
    with registered(Reassociate), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = load_tuned(program, server=url, cache_dir=tmp_path, compile=False)
    assert not [w for w in caught if w.category is FxtuneClientWarning]
    assert isinstance(module, CheckedInputs) and isinstance(module.tuned, SizeDispatch)
    dispatch = module.tuned
    # Bucket 0's graph is reassociated (x @ W first: x's mm takes a weight), bucket 1's not.
    for k, reassociated in ((0, True), (1, False)):
        gm = dispatch.branches[k]
        x_node = next(iter(gm.graph.find_nodes(op="placeholder")))
        (mm,) = [u for u in x_node.users if u.target is torch.ops.aten.mm.default]
        assert (mm.args[1].op == "get_attr") is reassociated
    for batch, bucket in _edges(outcome.config):
        x, want = _original_at(model, batch)
        assert dispatch.bucket_index((x,)) == bucket
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = module(x)
        assert not caught
        torch.testing.assert_close(got, want, **TOL)
    # Outside the range: the untuned module, with one warning (batch 1: export guards no
    # lower bound, so the original answers; above the maximum it raises its own guard error).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        low = module(*_inputs(1))
        with pytest.raises(AssertionError):
            module(*_inputs(4097))
    warned = [str(w.message) for w in caught if w.category is FxtuneClientWarning]
    assert len(warned) == 1 and "batch = 1 is outside" in warned[0]
    torch.testing.assert_close(low, model(*_inputs(1)), **TOL)


def test_a_config_whose_buckets_leave_a_gap_is_not_used(
    chain: tuple[nn.Module, Any],
    tuned: tuple[Any, Path],
    config_service: tuple[str, FakeService],
    tmp_path: Path,
) -> None:
    """Sizes in a gap would have no module: the client runs the model untuned, with why."""
    _, program = chain
    outcome, _ = tuned
    doc = outcome.config.model_dump(by_alias=True)
    doc["buckets"][1]["min"] += 10
    url, fake = config_service
    fake.configs[outcome.config.model_fingerprint] = doc
    with registered(Reassociate), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = load_tuned(program, server=url, cache_dir=tmp_path, compile=False)
    warned = [str(w.message) for w in caught if w.category is FxtuneClientWarning]
    assert len(warned) == 1 and "do not tile batch in [2, 4096]" in warned[0]
    assert not isinstance(module, CheckedInputs)


# ------------------------------------------------- a pass set per bucket, from per-size sites


@pytest.fixture(scope="module")
def two_chains(tmp_path_factory: Any) -> tuple[nn.Module, Any, Path]:
    """`TwoChainNet`: each planted pass is faster at one end of the batch range and slower at
    the other, so the never-worse rule keeps neither site, and every pass together undoes
    one with the other (`Associate` re-associates what `Reassociate` made)."""
    model = TwoChainNet().eval()
    batch = Dim("batch", min=2, max=4096)
    program = torch.export.export(
        model, _inputs(32), dynamic_shapes={"x": {0: batch}}, strict=False
    )
    out = tmp_path_factory.mktemp("two_chains")
    options = TuneOptions(
        budget_s=40,
        backends=["eager"],
        passes=["test_reassociate", "test_associate"],
        cache_path=out / "cache.json",
        sizes={"batch": SIZES},
        workdir=out / "work",
        threads=1,
    )
    with registered(Reassociate, Associate), tuning_session(options) as session:
        outcome = tune_program(program, session)
        write_outputs(outcome, out / "tuned.pt2", out / "report.json", profile=False)
    return model, outcome, out


@pytest.mark.slow
def test_each_bucket_runs_the_sites_that_won_at_its_sizes(
    two_chains: tuple[nn.Module, Any, Path],
) -> None:
    model, outcome, out = two_chains
    config = outcome.config
    kept = {(d.pass_name, d.accepted) for d in config.sites}
    assert kept == {("test_reassociate", False), ("test_associate", False)}
    assert len(config.buckets) == 2, config.tuning["buckets"]
    small, large = config.buckets
    assert small.contains(2) and large.contains(1024)
    # The small sizes' own site set, offered as a candidate and measured: only the site that
    # was faster there; the large bucket runs a set with the other site in it.
    assert small.name.startswith("eager + passes faster at batch=")
    assert [(s.pass_name, len(s.sites)) for s in small.passes] == [("test_reassociate", 1)]
    assert "test_associate" in {s.pass_name for s in large.passes}
    for bucket in config.buckets:
        assert bucket.per_size and all(f.verdict == "faster" for f in bucket.per_size)
    module = load_program(out / "tuned.pt2").module()
    for batch, _ in _edges(config):
        x = _inputs(batch, seed=batch)
        with torch.no_grad():
            torch.testing.assert_close(module(*x), model(*x), **TOL)
