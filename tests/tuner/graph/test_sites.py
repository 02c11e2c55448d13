"""Site ids: the same on every device, and the ids stored before that still replay.

The GPU check (H200, torch 2.11) found a config tuned on CUDA that did not replay on the CPU
program: embedding_bag's unused results have other shapes on CUDA, and they were hashed. These
tests need no GPU: CUDA is faked (fake tensors on a "cuda" device run the same meta kernels).
"""

from __future__ import annotations

import pytest
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from examples.models import EXAMPLES
from tuner.graph.capture import export_module, to_graph_module
from tuner.graph.sites import structural_id
from tuner.passes import get_pass, pass_names
from tuner.passes.apply import apply_steps


def _captured(name: str) -> tuple[fx.GraphModule, tuple[object, ...]]:
    example = EXAMPLES[name]()
    program = export_module(example.module, example.example_inputs)
    return to_graph_module(program), tuple(example.example_inputs)


def _as_if_on_cuda(gm: fx.GraphModule, inputs: tuple[object, ...]) -> None:
    """Re-propagate `gm`'s values as fake CUDA tensors (its weights too), as a capture on a GPU
    would: the meta kernels take their CUDA branches."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(t: torch.Tensor) -> FakeTensor:
        return FakeTensor(mode, t.detach().to("meta"), torch.device("cuda", 0))

    for name, tensor in [*gm.named_parameters(), *gm.named_buffers()]:
        owner_path, _, attr = name.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        value = fake(tensor)
        if isinstance(tensor, torch.nn.Parameter):
            value = torch.nn.Parameter(value, requires_grad=False)
        setattr(owner, attr, value)
    args = [fake(x) if isinstance(x, torch.Tensor) else x for x in inputs]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*args)


def _ids(gm: fx.GraphModule) -> dict[str, list[str]]:
    return {name: [s.id for s in get_pass(name).find_sites(gm)] for name in pass_names()}


@pytest.mark.parametrize("name", ["recsys", "cnn"])
def test_site_ids_are_the_same_on_cuda_and_on_the_cpu(name: str) -> None:
    gm, inputs = _captured(name)
    on_cpu = _ids(gm)
    _as_if_on_cuda(gm, inputs)
    assert _ids(gm) == on_cpu
    assert sum(map(len, on_cpu.values())) >= 3  # sites were found, so the ids were compared


def test_a_config_that_names_a_sites_former_id_still_replays() -> None:
    """Ids stored before unread results were left out (every config and decision until then)
    still select their site, and the replay records the site under the id the config knows."""
    gm, inputs = _captured("recsys")
    (site,) = get_pass("fuse_horizontal_embedding_bag").find_sites(gm)
    nodes = [n for n in gm.graph.nodes if n.name in site.nodes]
    assert site.legacy_id == structural_id(site.pass_name, nodes) != site.id
    assert site.id == structural_id(site.pass_name, nodes, read_only=True)
    replayed = apply_steps(gm, inputs, [(site.pass_name, {site.legacy_id})])
    assert [(s.pass_name, s.id) for s in replayed.applied] == [(site.pass_name, site.legacy_id)]
