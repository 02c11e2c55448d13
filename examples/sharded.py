"""A recommendation model with its embedding tables sharded across ranks (seed 000, section 3.3).

Table-wise model parallelism as TorchRec shards it: rank r holds tables
[r * T/N, (r + 1) * T/N) and looks them up for the whole global batch; the pooled embeddings
then go through one all-to-all (`torch.distributed._functional_collectives.all_to_all_single`)
so that every rank ends up with every table's embedding for its own slice of the batch. The dense
arm (an MLP on the rank's dense features) does not depend on that all-to-all: it is the compute
that can hide the communication once `overlap_comm_compute` moves the wait after it.

The sparse inputs each rank receives are its tables' ids for the global batch, i.e. what
TorchRec's input distribution (a first all-to-all of the ids) would have delivered; that first
all-to-all is left out to keep one collective per step.

`Reference` is the same model unsharded (all tables, the whole batch, one process) with the same
weights: rank r's output must equal rows [r * B/N, (r + 1) * B/N) of the reference's.

    python -m examples.sharded --world-size 2 --out build/sharded   # spawns 2 gloo ranks
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

Inputs = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class ShardedConfig:
    """Sizes of the example; `batch` is the global batch (split evenly across ranks)."""

    world_size: int = 2
    tables: int = 8
    rows: int = 4000
    dim: int = 64
    bag: int = 8
    batch: int = 1024
    dense_in: int = 128
    hidden: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tables % self.world_size or self.batch % self.world_size:
            raise ValueError("tables and batch must split evenly across world_size ranks")

    @property
    def local_tables(self) -> int:
        return self.tables // self.world_size

    @property
    def local_batch(self) -> int:
        return self.batch // self.world_size


def _dense_arm(cfg: ShardedConfig) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(cfg.dense_in, cfg.hidden),
        nn.ReLU(),
        nn.Linear(cfg.hidden, cfg.hidden),
        nn.ReLU(),
        nn.Linear(cfg.hidden, cfg.dim),
        nn.ReLU(),
    )


def _over_arch(cfg: ShardedConfig) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(cfg.dim * (cfg.tables + 1), cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, 1)
    )


class Reference(nn.Module):
    """The unsharded model: every table, the whole batch, one process."""

    def __init__(self, cfg: ShardedConfig) -> None:
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng():  # seeded weights without touching the caller's RNG
            torch.manual_seed(cfg.seed)
            self.tables = nn.ModuleList(
                nn.EmbeddingBag(cfg.rows, cfg.dim, mode="sum") for _ in range(cfg.tables)
            )
            self.dense_arm = _dense_arm(cfg)
            self.over_arch = _over_arch(cfg)
        self.eval()

    def forward(self, dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
        pooled = [t(sparse[2 * i], sparse[2 * i + 1]) for i, t in enumerate(self.tables)]
        d = self.dense_arm(dense)
        return self.over_arch(torch.cat([d, *pooled], dim=1))


class ShardedRank(nn.Module):
    """Rank `rank`'s part: its tables, then the all-to-all of pooled embeddings, then the arms."""

    def __init__(self, reference: Reference, rank: int) -> None:
        super().__init__()
        cfg = reference.cfg
        self.cfg = cfg
        first = rank * cfg.local_tables
        self.tables = copy.deepcopy(reference.tables[first : first + cfg.local_tables])
        self.dense_arm = copy.deepcopy(reference.dense_arm)
        self.over_arch = copy.deepcopy(reference.over_arch)
        self.eval()

    def forward(self, dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        n, b = cfg.world_size, cfg.local_batch
        # (B, T/N * D): this rank's tables for the whole batch; chunk j goes to rank j.
        pooled = torch.cat(
            [t(sparse[2 * i], sparse[2 * i + 1]) for i, t in enumerate(self.tables)], dim=1
        )
        received = funcol.all_to_all_single(pooled, None, None, dist.group.WORLD)
        d = self.dense_arm(dense)  # independent of the all-to-all
        # (N sources, b, T/N * D) -> (b, T * D) in global table order.
        emb = received.view(n, b, cfg.local_tables * cfg.dim).permute(1, 0, 2).reshape(b, -1)
        return self.over_arch(torch.cat([d, emb], dim=1))


def global_inputs(cfg: ShardedConfig, seed: int) -> Inputs:
    """Dense features for the whole batch, then (ids, offsets) per table, fixed bag size."""
    gen = torch.Generator().manual_seed(seed)
    dense = torch.randn(cfg.batch, cfg.dense_in, generator=gen)
    sparse: list[torch.Tensor] = []
    offsets = torch.arange(0, cfg.batch * cfg.bag, cfg.bag)
    for _ in range(cfg.tables):
        ids = torch.randint(0, cfg.rows, (cfg.batch * cfg.bag,), generator=gen)
        sparse += [ids, offsets.clone()]  # one offsets tensor per table, as a loader gives
    return (dense, *sparse)


def rank_inputs(cfg: ShardedConfig, inputs: Inputs, rank: int) -> Inputs:
    """What rank `rank` is given: its batch slice of dense features, its tables' sparse inputs."""
    dense, *sparse = inputs
    b = cfg.local_batch
    first = rank * cfg.local_tables
    local = sparse[2 * first : 2 * (first + cfg.local_tables)]
    return (dense[rank * b : (rank + 1) * b], *local)


def reference_slice(cfg: ShardedConfig, output: torch.Tensor, rank: int) -> torch.Tensor:
    """The rows of the unsharded output that rank `rank` computes."""
    return output[rank * cfg.local_batch : (rank + 1) * cfg.local_batch]


def rank_module(cfg: ShardedConfig, rank: int) -> ShardedRank:
    return ShardedRank(Reference(cfg), rank)


def export_rank(cfg: ShardedConfig, rank: int, seed: int = 1) -> torch.export.ExportedProgram:
    """Export rank `rank`'s module (the default process group must be initialised)."""
    module = rank_module(cfg, rank)
    inputs = rank_inputs(cfg, global_inputs(cfg, seed), rank)
    return torch.export.export(module, inputs, strict=False)


def _export_and_save(rank: int, world_size: int, cfg: ShardedConfig, pattern: str) -> str:
    from tuner.distributed.tune import rank_path

    path = rank_path(pattern, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(export_rank(cfg, rank), path)
    return str(path)


def build(out_dir: Path | str, cfg: ShardedConfig) -> list[Path]:
    """Export every rank's program on a real gloo group and save `sharded_rank{r}.pt2`."""
    from tuner.distributed.ranks import run_ranks

    pattern = str(Path(out_dir) / "sharded_rank{rank}.pt2")
    paths = run_ranks(_export_and_save, cfg.world_size, cfg, pattern, backend="gloo")
    return [Path(p) for p in paths]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("build/sharded"))
    args = parser.parse_args(argv)
    cfg = ShardedConfig(world_size=args.world_size)
    for path in build(args.out, cfg):
        print(path)
    print(asdict(cfg))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
