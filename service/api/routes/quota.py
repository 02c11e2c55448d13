"""The caller's quotas: what it holds against each limit, and the service's check slots."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from service.analysis import ProgramAnalysis
from service.api.deps import AnalysisDep, QuotasDep, ReaderIdentity, StoreDep
from service.api.errors import errors
from service.api.schemas import ChecksOut, QuotaOut, UseOut
from service.quotas import Quotas
from service.store import AbstractStore

router = APIRouter(tags=["quota"])


@router.get("/quota", response_model=QuotaOut, responses=errors(401))
async def get_quota(
    caller: ReaderIdentity, store: StoreDep, quotas: QuotasDep, analysis: AnalysisDep
) -> QuotaOut:
    """Queued and running jobs, stored bytes and uploads in the last minute, against limits."""
    return await run_in_threadpool(quota_of, caller, store, quotas, analysis)


def quota_of(
    caller: str, store: AbstractStore, quotas: Quotas, analysis: ProgramAnalysis
) -> QuotaOut:
    """Also what the dashboard shows."""
    use = quotas.usage(caller, store.owner_usage(caller))
    gate = analysis.gate.state() if analysis.gate is not None else None
    checks = None
    if gate is not None:
        waiting = gate.waiting_uploads + gate.waiting_results
        checks = ChecksOut(
            running=gate.running, waiting=waiting, slots=gate.slots, queue=gate.queue
        )
    return QuotaOut(
        identity=caller,
        **{k: UseOut(used=u.used, limit=u.limit) for k, u in use.items()},
        checks=checks,
    )
