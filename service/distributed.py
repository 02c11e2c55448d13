"""Distributed jobs on the service side: the ranks' uploads must share one structure, and a
result becomes one tuned config per rank model (`tuner.distributed.config`)."""

from __future__ import annotations

from typing import Any

from service.reports import ReportError, tuning_result
from service.store import Job, Model, TuningResult
from tuner.distributed.config import DistributedReportError, rank_config


class RankModelsError(ValueError):
    """The models named for the ranks cannot form one distributed job (the message says why)."""


def program_field(rank: int) -> str:
    """The multipart field of rank `rank`'s tuned program (rank 0's is the usual `program`)."""
    return "program" if rank == 0 else f"program_rank{rank}"


def check_rank_models(model_id: int, models: list[Model]) -> None:
    """Rank 0 is the model in the path; every rank its own upload, all of one fingerprint.

    Fingerprints ignore weights, so the sharded ranks of one model (own tables, same graph)
    agree, and a program of another model is refused before any worker spends time on it."""
    if models[0].id != model_id:
        raise RankModelsError(f"rank_models[0] must be model {model_id} (the model in the path)")
    ids = [m.id for m in models]
    if len(set(ids)) != len(ids):
        raise RankModelsError(f"every rank needs its own uploaded program: {ids}")
    for m in models:
        if m.fingerprint is None:
            raise RankModelsError(
                f"model {m.id} has no fingerprint (stored before uploads were checked): "
                "upload its file again"
            )
    if len({m.fingerprint for m in models}) != 1:
        prints = {m.id: m.fingerprint for m in models}
        raise RankModelsError(f"the ranks' programs do not share one structure: {prints}")


def rank_results(
    report: dict[str, Any], job: Job, models: list[Model], digests: dict[str, str]
) -> list[TuningResult]:
    """One result per rank, each checked against its model; raises ReportError."""
    if report.get("world_size") != job.world_size:
        raise ReportError(
            f"the report is for world size {report.get('world_size')!r}, "
            f"job {job.id} for {job.world_size}"
        )
    results = []
    for rank, model in enumerate(models):
        field = program_field(rank)
        if field not in digests:
            raise ReportError(f"the tuned program of rank {rank} ({field}) is missing")
        try:
            config = rank_config(report, rank)
        except DistributedReportError as exc:
            raise ReportError(str(exc)) from None
        result = tuning_result(
            {"config": config}, {"report": digests["report"], "program": digests[field]}
        )
        if result.fingerprint != model.fingerprint:
            raise ReportError(
                f"the report's model_fingerprint {result.fingerprint} is not that of model "
                f"{model.id} (rank {rank}): this result belongs to another model"
            )
        results.append(result)
    return results
