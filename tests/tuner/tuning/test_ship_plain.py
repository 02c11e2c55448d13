"""What ships is what was timed: a plain package; peers always compared; profiles attributed."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch

from examples.models import Example, recsys
from tests.tuner.tuning_fixtures import SplitNormTanh
from tuner.backends import registry as backends
from tuner.graph.capture import export_module, to_graph_module
from tuner.profiling.profile import profile_callable
from tuner.tuning.tuner import TuneOptions, Tuner, tuning_session


@pytest.fixture(scope="module")
def recsys_packages(tmp_path_factory: pytest.TempPathFactory) -> tuple[Example, Path, Path]:
    """The recsys example at 4 features, not 32: its embedding bags, LayerNorms and linears at a
    quarter of the full model's compile, compiled plain and instrumented. A large batch keeps
    the kernels' time well above the profiler's own per-call overhead."""
    example = recsys(batch=2048, num_sparse=4)
    program = export_module(example.module, example.example_inputs)
    work = tmp_path_factory.mktemp("recsys")
    plain = backends.package_aoti(program, work / "plain.aoti.pt2")
    twin = backends.package_aoti(program, work / "twin.aoti.pt2", instrumented=True)
    return example, plain, twin


@pytest.mark.slow
def test_the_shipped_package_carries_no_kernel_ranges(
    recsys_packages: tuple[Example, Path, Path],
) -> None:
    example, plain, twin = recsys_packages
    inputs = example.example_inputs
    shipped = backends.load_aoti(plain)
    summary = profile_callable(lambda: shipped(*inputs), iterations=3)
    assert summary.kernels_per_iter is None  # no ranges: nothing of inductor's is in the trace
    instrumented = backends.load_aoti(twin)
    assert profile_callable(lambda: instrumented(*inputs), iterations=3).kernels_per_iter


@pytest.mark.slow
def test_profile_of_an_aoti_recsys_attributes_its_kernels(
    recsys_packages: tuple[Example, Path, Path],
) -> None:
    """The dashboard showed matmul, norm and embedding at 0 µs for the tuned recsys."""
    example, _, twin = recsys_packages
    inputs = example.example_inputs
    runner = backends.load_aoti(twin)
    summary = profile_callable(lambda: runner(*inputs), iterations=3)
    times = summary.time_by_category_us
    assert times["matmul_conv"] > 0 and times["norm"] > 0 and times["embedding"] > 0, times
    categorized = sum(times.values())
    assert summary.cpu_dispatch_overhead_us < categorized, (summary, times)


def test_whole_model_candidates_always_include_the_plain_peers(tmp_path: Path) -> None:
    program = export_module(SplitNormTanh(n=4).eval(), (torch.randn(8, 64),))
    gm = to_graph_module(program)
    inputs = (torch.randn(8, 64),)
    options = TuneOptions(passes=["fuse_horizontal_layernorm"], cache_path=tmp_path / "c.json")
    with tuning_session(options) as session:
        names = [c.name for c in Tuner(session).kind.candidates(gm, inputs, [], session.passes)]
    assert names[:2] == ["inductor", "compile"]
    assert "eager + every pass" in names


def test_compile_backend_runs_the_module_as_torch_compile_would(tmp_path: Path) -> None:
    module = SplitNormTanh(n=2).eval()
    x = torch.randn(4, 32)
    gm = to_graph_module(export_module(module, (x,)))
    built = backends.build("compile", gm, (x,), tmp_path)
    torch.testing.assert_close(built.runner(x), module(x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_package_that_answers_wrongly_is_removed_not_shipped(
    recsys_packages: tuple[Example, Path, Path], tmp_path: Path
) -> None:
    """write_outputs recorded a package's error against the original and shipped it anyway."""
    from tuner.tuning.outputs import _ships

    example, plain, _ = recsys_packages
    package = Path(shutil.copy(plain, tmp_path / "p.aoti.pt2"))
    trials = [example.example_inputs, example.fresh_inputs(1)]
    refused: list[str] = []
    error = _ships(package, example.module, trials, refused)
    assert error is not None and error < 1e-4 and package.exists() and not refused
    other = copy.deepcopy(example.module)  # same shapes, other weights: answers differ
    with torch.no_grad():
        for param in other.parameters():
            param.add_(torch.randn_like(param))
    assert _ships(package, other, trials, refused) is None
    assert not package.exists()
    assert len(refused) == 1 and "outputs differ" in refused[0]
