"""Issue 9 on real models: transformers' BERT with a dynamic batch and sequence length, and the
recsys example with a dynamic batch (stacked embedding bag included), tuned and then served at
sizes other than the example's with the original's outputs."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export import Dim

from examples.dynamic import recsys
from tests.tuner.test_client import FakeService, service  # noqa: F401  (service: the fixture)
from tuner.apply import apply_passes
from tuner.client import CheckedInputs, FxtuneClientWarning, load_tuned
from tuner.load import load_program
from tuner.outputs import write_outputs
from tuner.passes import pass_names
from tuner.tune import TuneOptions, tune_program

TOL = {"atol": 1e-4, "rtol": 1e-4}


def _flat(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _assert_same(got: Any, want: Any) -> None:
    for g, w in zip(_flat(got), _flat(want), strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, **TOL)


def _tune(program: Any, out: Path, sizes: dict[str, list[int]]) -> Any:
    options = TuneOptions(
        budget_s=40, backends=["eager"], cache_path=out / "cache.json", sizes=sizes
    )
    outcome = tune_program(program, options)
    write_outputs(outcome, out / "tuned.pt2", out / "report.json", profile=False)
    return outcome


def _client(program: Any, outcome: Any, url: str, fake: FakeService, cache: Path) -> Any:
    fake.configs[outcome.config.model_fingerprint] = outcome.config.model_dump(by_alias=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = load_tuned(program, server=url, cache_dir=cache, compile=False)
    assert not [w for w in caught if w.category is FxtuneClientWarning]
    assert isinstance(module, CheckedInputs)
    return module


# ------------------------------------------------------------------------------------- BERT

transformers = pytest.importorskip("transformers")
PAIRS = [(2, 8), (4, 16), (8, 32)]  # (batch, seq); (4, 16) is the export's example


def _bert() -> Any:
    from tests.tuner.test_real_models import bert

    model, _ = bert("sdpa")
    return model


def bert_inputs(batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 200, (batch, seq), generator=g)
    mask = (torch.arange(seq) < torch.randint(2, seq + 1, (batch, 1), generator=g)).long()
    return ids, mask


@pytest.mark.slow
def test_bert_with_dynamic_batch_and_sequence_is_served_at_three_sizes(
    service: tuple[str, FakeService],  # noqa: F811
    tmp_path: Path,
) -> None:
    model = _bert()
    batch, seq = Dim("batch", min=2, max=64), Dim("seq", min=2, max=32)
    both = {0: batch, 1: seq}
    program = torch.export.export(
        model, bert_inputs(4, 16), dynamic_shapes=((both, both),), strict=False
    )
    outcome = _tune(program, tmp_path, {"batch": [2, 8], "seq": [8, 32]})
    config = outcome.config
    assert [d["name"] for d in config.shapes["dims"]] == ["batch", "seq"]
    assert [p["label"] for p in config.tuning["sizes"]] == [
        "batch=4,seq=16",
        "batch=2,seq=8",
        "batch=8,seq=32",
    ]
    assert config.verification.passed
    # Every pass on its own (not only what tuning kept) keeps both symbols.
    every = apply_passes(program, pass_names())
    assert "fuse_horizontal_linear" in {s.pass_name for s in every.applied}
    rewritten = every.to_program().module()
    tuned = load_program(tmp_path / "tuned.pt2").module()
    url, fake = service
    client = _client(program, outcome, url, fake, tmp_path / "configs")
    with torch.no_grad():
        for b, s in PAIRS:
            x = bert_inputs(b, s, seed=b + s)
            want = model(*x)
            for run in (rewritten, tuned, client):
                _assert_same(run(*x), want)
    with pytest.raises(AssertionError, match="<= 32"):
        tuned(*bert_inputs(2, 33))


# ----------------------------------------------------------------------------------- recsys


@pytest.mark.slow
def test_recsys_with_a_dynamic_batch_is_served_at_every_batch(
    service: tuple[str, FakeService],  # noqa: F811
    tmp_path: Path,
) -> None:
    model, program, make = recsys(batch=64)
    every = apply_passes(program, pass_names())
    applied = {s.pass_name for s in every.applied}
    assert {"fuse_horizontal_embedding_bag", "fuse_horizontal_layernorm"} <= applied
    # combine_sparse_inputs cannot keep per-feature index counts dynamic: refused, with why.
    assert "combine_sparse_inputs" not in applied
    outcome = _tune(program, tmp_path, {"batch": [2, 512]})
    refusals = [r for r in outcome.config.refusals if r.pass_name == "combine_sparse_inputs"]
    assert refusals and "dynamic size" in refusals[0].reason
    assert outcome.config.verification.passed
    rewritten = every.to_program().module()
    tuned = load_program(tmp_path / "tuned.pt2").module()
    url, fake = service
    client = _client(program, outcome, url, fake, tmp_path / "configs")
    with torch.no_grad():
        for b in (2, 8, 64, 1000):
            x = make(b, b)
            want = model(*x)
            for run in (rewritten, tuned, client):
                _assert_same(run(*x), want)
