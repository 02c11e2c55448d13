from pathlib import Path

import pytest
import torch

from examples.build import build_all, main
from examples.models import EXAMPLES, Example
from tests.passes_helpers import apply_every_pass, assert_round_trip, fired, outputs_of
from tuner.graph.capture import example_inputs
from tuner.loading.load import load_program

NAMES = sorted(EXAMPLES)

# The pass each example exists to exercise, and the fewest sites it must find there.
EXPECTED_SITES: dict[str, dict[str, int]] = {
    "recsys": {
        "remove_dropout": 1,
        "combine_sparse_inputs": 1,
        "fuse_horizontal_embedding_bag": 1,
        "fuse_horizontal_linear": 1,
        "fuse_horizontal_layernorm": 1,
        "fuse_horizontal_pointwise": 1,
        "eliminate_split_cat": 1,
        "tanh_via_sigmoid": 1,
    },
    "cnn": {"fold_conv_bn": 4, "channels_last": 1},
    "transformer": {"remove_dropout": 4, "fuse_horizontal_linear": 2},
}


def eager(example: Example, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    with torch.no_grad():
        return outputs_of(example.module(*inputs))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_all(tmp_path_factory.mktemp("examples"))


def test_build_writes_every_example(built: dict[str, Path]) -> None:
    assert sorted(built) == NAMES
    assert all(path.name == f"{name}.pt2" and path.is_file() for name, path in built.items())


@pytest.mark.parametrize("name", NAMES)
def test_loaded_program_matches_eager(name: str, built: dict[str, Path]) -> None:
    example = EXAMPLES[name]()
    assert not example.module.training
    program = load_program(built[name])
    stored = example_inputs(program)
    assert all(torch.equal(a, b) for a, b in zip(stored, example.example_inputs, strict=True))
    loaded = program.module()
    for inputs in (example.example_inputs, example.fresh_inputs(7)):
        with torch.no_grad():
            got = outputs_of(loaded(*inputs))
        for g, e in zip(got, eager(example, inputs), strict=True):
            torch.testing.assert_close(g, e)


@pytest.mark.parametrize("name", NAMES)
def test_examples_are_deterministic(name: str) -> None:
    first, second = EXAMPLES[name](), EXAMPLES[name]()
    assert all(
        torch.equal(a, b) for a, b in zip(first.example_inputs, second.example_inputs, strict=True)
    )
    got = eager(second, first.example_inputs)
    for g, e in zip(got, eager(first, first.example_inputs), strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_fresh_inputs_keep_shapes_but_change_values() -> None:
    example = EXAMPLES["recsys"]()
    fresh = example.fresh_inputs(5)
    assert [x.shape for x in fresh] == [x.shape for x in example.example_inputs]
    assert not torch.equal(fresh[0], example.example_inputs[0])
    assert not torch.equal(fresh[2], example.example_inputs[2])  # offsets of feature 0


def test_recsys_inputs_are_valid_bags() -> None:
    example = EXAMPLES["recsys"]()
    dense, *sparse = example.example_inputs
    assert dense.shape == (256, 13)
    assert len(sparse) == 64
    for indices, offsets in zip(sparse[::2], sparse[1::2], strict=True):
        sizes = torch.diff(offsets, append=torch.tensor([len(indices)]))
        assert offsets.shape == (256,) and offsets[0] == 0
        assert int(sizes.min()) >= 1 and int(sizes.max()) <= 5
        assert int(indices.min()) >= 0 and int(indices.max()) < 1000


def test_build_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main([str(tmp_path)]) == 0
    assert sorted(p.stem for p in tmp_path.glob("*.pt2")) == NAMES
    assert "recsys" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_pass_leaves_example_unharmed(name: str, tmp_path: Path) -> None:
    example = EXAMPLES[name]()
    result = apply_every_pass(example.module, example.make_inputs)
    assert_round_trip(result, example.module, example.make_inputs, tmp_path / "t.pt2", atol=1e-4)
    counts = fired(result)
    print(f"{name}: {counts}")
    for pass_name, minimum in EXPECTED_SITES[name].items():
        assert counts.get(pass_name, 0) >= minimum, (pass_name, counts)
