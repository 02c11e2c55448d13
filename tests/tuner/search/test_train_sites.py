"""Per-site search in training (tuner.search.site_search.FORWARD_BACKWARD,
tuner.training.step.site_step): a site is checked and timed forward + backward, a rewrite that keeps
the forward but changes a
gradient is rejected before timing, and the winning sites become a whole-model candidate."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from examples.training import export_for_training, recsys_train
from tests.tuner.tuning_fixtures import HalfGradRelu, registered, relu_net_program
from tuner.contract.config import Figures, PassStep, TunedConfig
from tuner.deploy.replay import apply_config
from tuner.graph.capture import Inputs, export_module, to_graph_module
from tuner.measure.inputs import fresh_inputs
from tuner.passes import get_pass
from tuner.passes.apply import apply_steps
from tuner.search.decisions import DecisionCache, JsonDecisionCache
from tuner.search.extract import external_inputs, extract_site, find_same_site, record_values
from tuner.search.site_search import FORWARD, FORWARD_BACKWARD, SearchSettings, SiteRun, SiteSearch
from tuner.training.step import ReferenceSteps, check_site_step, eager_runner, site_step, wants_grad
from tuner.tuning.train import TrainingStep
from tuner.tuning.tuner import TuneOptions, Tuner, tune_program, tuning_session


def _relu_net() -> tuple[torch.fx.GraphModule, Inputs]:
    program, x = relu_net_program()
    return to_graph_module(program, train=True), x


def _search(run: SiteRun, cache: DecisionCache) -> SiteSearch:
    settings = SearchSettings(
        passes=["test_half_grad_relu"], site_budget_s=0.5, hardware_key="test", run=run
    )
    return SiteSearch(settings, cache)


def test_a_forward_identical_site_rewrite_that_halves_a_gradient_is_rejected_untimed(
    tmp_path: Path,
) -> None:
    gm, x = _relu_net()
    cache = JsonDecisionCache(tmp_path / "cache.json")
    with registered(HalfGradRelu):
        # The control: judged on its forward alone, the planted rewrite passes and is timed.
        forward = _search(FORWARD, cache).run(copy.deepcopy(gm), x)
        trained = _search(FORWARD_BACKWARD, cache).run(copy.deepcopy(gm), x)
    (seen,) = forward.decisions
    assert seen.verdict != "wrong outputs" and forward.timed == 1
    # The forward's decision (cached) is not reused for the training run, which rejects it.
    assert cache.hits == 0
    (decision,) = trained.decisions
    assert decision.verdict == "wrong outputs" and not decision.accepted
    # The relu's input is fc1's output: a gradient the step carries back, halved here.
    assert "gradient of input linear" in (decision.reason or "")
    assert trained.timed == 0 and trained.samples == {} and trained.steps == []


class TwoHeads(nn.Module):
    """Two linears on one activation (fused into one linear), fed by a model input through a
    linear, so the site reads an input that carries a gradient and parameters of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.heads = nn.ModuleList(nn.Linear(32, 8) for _ in range(2))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.relu(self.stem(x))
        return tuple(head(h) for head in self.heads)


def _linear_site() -> tuple[torch.fx.GraphModule, torch.fx.GraphModule, Inputs]:
    """The heads' site extracted from the training step, and its fused copy."""
    torch.manual_seed(0)
    x = (torch.randn(8, 16),)
    gm = to_graph_module(export_module(TwoHeads().train(), x), train=True)
    graph_pass = get_pass("fuse_horizontal_linear")
    (site,) = graph_pass.find_sites(gm)
    values = record_values(gm, x, external_inputs(gm, site.nodes), grad=True)
    piece = extract_site(gm, site.nodes, values)
    fused = copy.deepcopy(piece.gm)
    same = find_same_site(graph_pass, fused, site)
    assert same is not None
    apply_steps(fused, piece.inputs, [("fuse_horizontal_linear", {site.id})])
    return piece.gm, fused, piece.inputs


def test_a_training_site_keeps_its_parameters_as_leaves_and_its_gradients() -> None:
    reference, fused, inputs = _linear_site()
    # The activation carries a gradient in the step; recorded with autograd on, it says so.
    assert wants_grad(inputs) == [True]
    params = {name for name, _ in reference.named_parameters()}
    assert params == {f"heads.{i}.{w}" for i in range(2) for w in ("weight", "bias")}
    # Extracted from a training step, the site is rewritten as one: the weights are
    # concatenated inside the graph from the original parameters, not stored as a constant.
    assert {name for name, _ in fused.named_parameters()} == params
    assert len(fused.graph.find_nodes(op="call_function", target=torch.ops.aten.cat.default)) > 0
    trials = [inputs, *fresh_inputs(inputs, 2)]
    assert check_site_step(reference, fused, trials, wants_grad(inputs)) is None
    # The same check sees a parameter the rewrite stops training.
    frozen = copy.deepcopy(fused)
    frozen.get_parameter("heads.1.weight").requires_grad_(False)
    wrong = check_site_step(reference, frozen, trials, wants_grad(inputs))
    assert wrong is not None and "gradient of heads.1.weight" in wrong


def test_the_timed_site_step_runs_the_backward_to_inputs_and_parameters() -> None:
    reference, _, inputs = _linear_site()
    seen: list[str] = []
    for name, p in reference.named_parameters():
        p.register_hook(lambda g, name=name: seen.append(name))
    step = site_step(reference, inputs)
    seen.clear()
    with torch.inference_mode():  # as `tuner.measure.timing.compare` calls it
        out = step()
    assert len(out) == 2 and sorted(seen) == sorted(n for n, _ in reference.named_parameters())
    assert all(p.grad is None for p in reference.parameters())  # nothing accumulates


def test_winning_sites_are_a_whole_model_candidate_under_each_backend(tmp_path: Path) -> None:
    example = recsys_train(batch=16, num_sparse=4)
    program = export_for_training(example)
    gm = to_graph_module(program, train=True)
    inputs = example.example_inputs
    every = ["fuse_horizontal_embedding_bag", "fuse_horizontal_linear"]
    (site,) = get_pass("fuse_horizontal_embedding_bag").find_sites(gm)
    won = [PassStep(pass_name=site.pass_name, sites=[site.id])]
    options = TuneOptions(mode="train", backends=["eager", "compile"], workdir=tmp_path)
    with tuning_session(options) as session:
        kind = Tuner(session).kind
        assert isinstance(kind, TrainingStep)
        candidates = kind.candidates(gm, inputs, won, every)
    by_name = {c.name: c for c in candidates}
    for backend in ("eager", "compile"):
        cand = by_name[f"{backend} + winning sites"]
        assert cand.passes == won and [s.id for s in cand.transformed.applied] == [site.id]
    # Each set is offered once: the winning sites equal the embedding bag pass alone here.
    assert "eager + fuse_horizontal_embedding_bag" not in by_name
    assert len({(*map(repr, c.passes), c.backend) for c in candidates}) == len(candidates)


@pytest.fixture(scope="module")
def tuned_recsys(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    example = recsys_train(batch=32, num_sparse=8)
    program = export_for_training(example)
    options = TuneOptions(
        mode="train",
        optimizer="sgd",
        backends=["eager"],
        budget_s=40,
        site_budget_s=0.5,
        whole_model_budget_s=1.5,
        threads=1,
        cache_path=tmp_path_factory.mktemp("cache") / "c.json",
    )
    return example, program, tune_program(program, options)


@pytest.mark.slow
def test_a_recsys_tuned_in_train_mode_reports_per_site_decisions(tuned_recsys: tuple) -> None:
    _, _, outcome = tuned_recsys
    config = TunedConfig.from_json(outcome.config.to_json())
    assert config.mode == "train"
    passes = {d.pass_name for d in config.sites}
    assert {"fuse_horizontal_embedding_bag", "fuse_horizontal_linear"} <= passes
    assert all(get_pass(p).train_safe for p in passes)
    for d in config.sites:
        assert d.accepted == (d.verdict == "faster")
        if d.verdict in ("faster", "slower", "within noise"):
            assert d.rounds > 0 and d.baseline_s and d.candidate_s and d.ci is not None
            assert outcome.samples[f"{d.pass_name}:{d.site_id}"]["baseline_s"]
        else:
            assert d.reason
    assert any("forward + backward" in note for note in config.tuning["notes"])
    won = {(d.pass_name, d.site_id) for d in config.sites if d.accepted}
    winning = [c for c in config.candidates if c.name == "eager + winning sites"]
    if winning:
        assert _sites_of(winning[0]) == won
    else:  # no site won, or every site that fires did: that set is "every pass"
        every = next(c for c in config.candidates if c.name == "eager + every pass")
        assert not won or _sites_of(every) == won


def _sites_of(figures: Figures) -> set[tuple[str, str]]:
    return {(step.pass_name, site) for step in figures.passes for site in step.sites}


@pytest.mark.slow
def test_the_accepted_train_config_trains_as_the_original_on_fresh_inputs(
    tuned_recsys: tuple,
) -> None:
    example, program, outcome = tuned_recsys
    config = outcome.config
    assert config.verification.passed, config.verification.reason
    replay = apply_config(program, TunedConfig.from_json(config.to_json()))
    original = to_graph_module(program, train=True)
    trials = [example.fresh_inputs(seed) for seed in (101, 102)]
    reference = ReferenceSteps(original, "sgd", trials, seed=7)
    assert reference.check(eager_runner(replay.gm, "sgd"), replay.pack) is None
    # The check is not blind: a step with one gradient halved fails it.
    with registered(HalfGradRelu):
        planted = apply_steps(copy.deepcopy(original), trials[0], [("test_half_grad_relu", None)])
    assert planted.applied
    assert reference.check(eager_runner(planted.gm, "sgd")) is not None
