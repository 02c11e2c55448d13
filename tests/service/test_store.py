"""The job queue and config store, on SQLite and PostgreSQL, with the clock passed in."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from service.db.engine import make_engine
from service.db.migrate import upgrade_to_head
from service.db.models import utcnow
from service.reports import tuning_result
from service.store import NotFound, OverQuota, OwnerUsage, QueuePolicy, StaleLease, TuningResult
from service.store.sqlalchemy_store import SqlAlchemyStore
from tests.service.fakes import FINGERPRINT, config, training_config

DIGESTS = {"report": "r" * 64, "program": "b" * 64}
POLICY = QueuePolicy(lease_s=30, max_attempts=2, backoff_s=10, backoff_max_s=100)
SHA = "a" * 64


@pytest.fixture
def store(db_url: str) -> Iterator[SqlAlchemyStore]:
    engine = make_engine(db_url)
    upgrade_to_head(engine)
    yield SqlAlchemyStore(engine, POLICY)
    engine.dispose()


def result(speedup: float = 1.5, **hardware: str) -> TuningResult:
    report = {"config": config(speedup=speedup, **hardware), "profiles": {"tuned": {"x": 1}}}
    digests = {"report": "r" * 64, "program": "b" * 64, "trace_tuned": "c" * 64}
    return tuning_result(report, digests)


def test_same_bytes_are_one_model(store: SqlAlchemyStore) -> None:
    first, created = store.add_model(SHA, "m", 10)
    again, created_again = store.add_model(SHA, "other name", 10)
    assert created and not created_again
    assert again == first
    assert [m.id for m in store.list_models()] == [first.id]


def test_enqueue_reuses_the_unfinished_job(store: SqlAlchemyStore) -> None:
    model, _ = store.add_model(SHA, "m", 10)
    job, created = store.enqueue_job(model.id, "cpu", 5)
    same, created_again = store.enqueue_job(model.id, "cpu", 5)
    other, created_other = store.enqueue_job(model.id, "cuda", None)
    assert created and not created_again and created_other
    assert same.id == job.id != other.id
    with pytest.raises(NotFound):
        store.enqueue_job(999, "cpu", None)


def test_claims_match_the_device_oldest_first(store: SqlAlchemyStore) -> None:
    ids = []
    for i, device in enumerate(["cuda", "cpu", "cpu"]):
        model, _ = store.add_model(f"{i:064x}", f"m{i}", 1)
        ids.append(store.enqueue_job(model.id, device, None)[0].id)
    first = store.claim_job("cpu", "w1", {"device": "cpu"})
    second = store.claim_job("cpu", "w2", {"device": "cpu"})
    assert first and second
    assert [first.job.id, second.job.id] == ids[1:]
    assert store.claim_job("cpu", "w3", {}) is None
    gpu = store.claim_job("cuda", "w4", {})
    assert gpu and gpu.job.id == ids[0]
    assert first.job.status == "running" and first.job.attempts == 1
    assert first.lease_token != second.lease_token


def test_heartbeat_extends_the_lease_and_checks_the_token(store: SqlAlchemyStore) -> None:
    model, _ = store.add_model(SHA, "m", 1)
    store.enqueue_job(model.id, "cpu", None)
    now = utcnow()
    claim = store.claim_job("cpu", "w", {}, now=now)
    assert claim
    later = now + timedelta(seconds=20)
    job = store.heartbeat(claim.job.id, claim.lease_token, 0.5, "halfway", now=later)
    assert job.progress == 0.5 and job.message == "halfway"
    assert job.lease_expires_at == later + timedelta(seconds=POLICY.lease_s)
    with pytest.raises(StaleLease):
        store.heartbeat(claim.job.id, "not-the-token", 0.6, None)
    # the extended lease outlives the original deadline
    assert store.requeue_expired(now + timedelta(seconds=POLICY.lease_s + 1)) == 0


def test_an_expired_lease_is_reclaimed_and_the_late_worker_refused(
    store: SqlAlchemyStore,
) -> None:
    model, _ = store.add_model(SHA, "m", 1)
    store.enqueue_job(model.id, "cpu", None)
    now = utcnow()
    lost = store.claim_job("cpu", "lost", {}, now=now)
    assert lost
    after_expiry = now + timedelta(seconds=POLICY.lease_s + 1)
    assert store.claim_job("cpu", "w2", {}, now=after_expiry) is None  # requeued, backing off
    job = store.get_job(lost.job.id)
    assert job.status == "queued" and "lease expired" in (job.error or "")
    retry_at = after_expiry + timedelta(seconds=POLICY.delay_s(1))
    second = store.claim_job("cpu", "w2", {}, now=retry_at)
    assert second and second.job.id == lost.job.id and second.job.attempts == 2
    with pytest.raises(StaleLease):
        store.complete_job(lost.job.id, lost.lease_token, result())
    with pytest.raises(StaleLease):
        store.fail_job(lost.job.id, lost.lease_token, "late", retryable=True)
    done, _ = store.complete_job(second.job.id, second.lease_token, result())
    assert done.status == "succeeded" and done.attempts == 2
    with pytest.raises(StaleLease):
        store.complete_job(second.job.id, second.lease_token, result())
    assert len(store.list_configs()) == 1


def test_failures_back_off_then_go_to_failed(store: SqlAlchemyStore) -> None:
    model, _ = store.add_model(SHA, "m", 1)
    store.enqueue_job(model.id, "cpu", None)
    now = utcnow()
    claim = store.claim_job("cpu", "w", {}, now=now)
    assert claim
    job = store.fail_job(claim.job.id, claim.lease_token, "boom", retryable=True, now=now)
    assert job.status == "queued" and job.error == "boom"
    assert job.not_before == now + timedelta(seconds=POLICY.backoff_s)
    assert store.claim_job("cpu", "w", {}, now=now + timedelta(seconds=1)) is None
    later = now + timedelta(seconds=POLICY.backoff_s + 1)
    claim = store.claim_job("cpu", "w", {}, now=later)
    assert claim and claim.job.attempts == 2
    job = store.fail_job(claim.job.id, claim.lease_token, "boom again", retryable=True, now=later)
    assert job.status == "failed" and job.error == "boom again" and job.finished_at == later
    assert store.claim_job("cpu", "w", {}, now=later + timedelta(days=1)) is None


def test_a_non_retryable_failure_is_final_at_once(store: SqlAlchemyStore) -> None:
    model, _ = store.add_model(SHA, "m", 1)
    store.enqueue_job(model.id, "cpu", None)
    claim = store.claim_job("cpu", "w", {})
    assert claim
    job = store.fail_job(claim.job.id, claim.lease_token, "refused to load", retryable=False)
    assert job.status == "failed" and job.attempts == 1


def test_the_reaper_dead_letters_after_the_last_attempt(store: SqlAlchemyStore) -> None:
    model, _ = store.add_model(SHA, "m", 1)
    job, _ = store.enqueue_job(model.id, "cpu", None)
    now = utcnow()
    for _ in range(POLICY.max_attempts):
        assert store.claim_job("cpu", "w", {}, now=now)
        now += timedelta(seconds=POLICY.lease_s + 1)
        assert store.requeue_expired(now) == 1
        now += timedelta(seconds=POLICY.backoff_max_s + 1)
    final = store.get_job(job.id)
    assert final.status == "failed" and "lease expired" in (final.error or "")


def test_completion_stores_the_config_its_rows_and_replaces_older_ones(
    store: SqlAlchemyStore,
) -> None:
    model, _ = store.add_model(SHA, "m", 1, FINGERPRINT)
    for speedup in (1.5, 2.5):
        store.enqueue_job(model.id, "cpu", None)
        claim = store.claim_job("cpu", "w", {})
        assert claim
        job, tuned = store.complete_job(claim.job.id, claim.lease_token, result(speedup))
        assert job.status == "succeeded" and job.progress == 1.0
    tuned = store.get_config(model.id, "cpu", details=True)
    assert tuned.summary.speedup == 2.5 and tuned.summary.backend == "eager"
    assert tuned.config["whole_model"]["speedup"] == 2.5
    # Per-site decisions live in the config JSON alone, with every field the tuner wrote.
    assert [d["site_id"] for d in tuned.config["sites"]] == ["s1"]
    assert tuned.config["sites"][0]["accepted"] and tuned.config["sites"][0]["ci"][0] == 1.8
    assert [(p.kind, p.trace_sha256) for p in tuned.profiles] == [("tuned", "c" * 64)]
    assert len(store.list_configs([model.id])) == 1
    assert store.get_model(model.id).fingerprint == tuned.summary.fingerprint
    by_fp = store.get_config_by_fingerprint(tuned.summary.fingerprint, "cpu")
    assert by_fp.summary.etag == tuned.summary.etag
    with pytest.raises(NotFound):
        store.get_config(model.id, "cuda")
    with pytest.raises(NotFound):
        store.get_config_by_fingerprint(tuned.summary.fingerprint, "cpu", hardware_key="other")


def test_training_and_inference_configs_of_one_model_live_side_by_side(
    store: SqlAlchemyStore,
) -> None:
    """Keyed by mode as well: a training run must not replace what inference deploys."""
    model, _ = store.add_model(SHA, "m", 1, FINGERPRINT)
    infer, _ = store.enqueue_job(model.id, "cpu", None)
    train, created = store.enqueue_job(model.id, "cpu", None, mode="train", optimizer="sgd")
    adamw, created_adamw = store.enqueue_job(model.id, "cpu", None, mode="train", optimizer="adamw")
    assert created and created_adamw and len({infer.id, train.id, adamw.id}) == 3
    assert (train.mode, train.optimizer) == ("train", "sgd") and infer.mode == "infer"
    assert store.enqueue_job(model.id, "cpu", None, mode="train", optimizer="sgd")[0].id == train.id
    reports = {
        infer.id: {"config": config(speedup=2.0)},
        train.id: {"config": training_config(speedup=1.25)},
    }
    for _ in range(2):
        claim = store.claim_job("cpu", "w", {})
        assert claim
        report = reports[claim.job.id]
        store.complete_job(claim.job.id, claim.lease_token, tuning_result(report, DIGESTS))
    assert store.get_config(model.id, "cpu").summary.speedup == 2.0
    trained = store.get_config(model.id, "cpu", mode="train")
    assert trained.summary.speedup == 1.25 and trained.summary.mode == "train"
    assert trained.config["training"]["optimizer"] == "sgd"
    by_fp = store.get_config_by_fingerprint(FINGERPRINT, "cpu", mode="train")
    assert by_fp.summary.id == trained.summary.id
    assert sorted(c.mode for c in store.list_configs([model.id])) == ["infer", "train"]
    other, _ = store.add_model("d" * 64, "untrained", 1)
    with pytest.raises(NotFound, match="no tuned training config"):
        store.get_config(other.id, "cpu", mode="train")


def test_other_hardware_gets_its_own_config(store: SqlAlchemyStore) -> None:
    model, _ = store.add_model(SHA, "m", 1)
    for name in ("cpu a", "cpu b"):
        store.enqueue_job(model.id, "cpu", None)
        claim = store.claim_job("cpu", "w", {})
        assert claim
        store.complete_job(claim.job.id, claim.lease_token, result(name=name))
    keys = sorted(c.hardware_key for c in store.list_configs())
    assert len(keys) == 2 and "cpu a" in keys[0] and "cpu b" in keys[1]
    assert "cpu a" in store.get_config(model.id, "cpu", keys[0]).summary.hardware_key


def test_a_distributed_job_goes_only_to_a_worker_with_enough_ranks(store: SqlAlchemyStore) -> None:
    ranks = [store.add_model(f"{i:064x}", f"rank{i}", 1)[0].id for i in range(2)]
    job, created = store.enqueue_job(ranks[0], "cpu", None, world_size=2, rank_models=ranks)
    assert created and job.world_size == 2 and job.rank_models == ranks
    same, again = store.enqueue_job(ranks[0], "cpu", None, world_size=2, rank_models=ranks)
    assert not again and same.id == job.id
    single, separate = store.enqueue_job(ranks[0], "cpu", None)  # a 1-rank job is another job
    assert separate and single.world_size == 1 and single.rank_models is None
    first = store.claim_job("cpu", "one-rank", {}, ranks=1)
    assert first and first.job.id == single.id  # the older 2-rank job was skipped
    assert store.claim_job("cpu", "one-rank", {}, ranks=1) is None
    assert store.claim_job("cpu", "default", {}) is None  # workers that declare nothing: 1 rank
    two = store.claim_job("cpu", "two-ranks", {}, ranks=2)
    assert two and two.job.id == job.id and two.job.rank_models == ranks


def test_a_distributed_result_stores_a_config_for_every_rank(store: SqlAlchemyStore) -> None:
    ranks = [store.add_model(f"{i:064x}", f"rank{i}", 1, FINGERPRINT)[0].id for i in range(2)]
    store.enqueue_job(ranks[0], "cpu", None, world_size=2, rank_models=ranks)
    claim = store.claim_job("cpu", "w", {}, ranks=4)
    assert claim
    rank1 = result(speedup=2.0)
    store.complete_job(claim.job.id, claim.lease_token, result(), other_ranks={ranks[1]: rank1})
    assert store.get_config(ranks[0], "cpu").summary.speedup == 1.5
    assert store.get_config(ranks[1], "cpu").summary.speedup == 2.0
    assert store.get_config(ranks[1], "cpu").summary.job_id == claim.job.id


def test_uploads_and_jobs_are_charged_to_their_owner_within_its_quota(
    store: SqlAlchemyStore,
) -> None:
    """Bytes count once, for who stored them first; a reused job costs nothing; the quota is
    checked in the transaction that charges it, and a refusal stores nothing."""
    a, _ = store.add_model(SHA, "a", 600, owner="alice", max_owner_bytes=1000)
    again, created = store.add_model(SHA, "a", 600, owner="bob", max_owner_bytes=1)
    assert not created and again.id == a.id
    with pytest.raises(OverQuota) as over:
        store.add_model("b" * 64, "b", 500, owner="alice", max_owner_bytes=1000)
    assert over.value.kind == "stored_bytes" and store.model_with_sha256("b" * 64) is None
    b, _ = store.add_model("b" * 64, "b", 500, owner="bob", max_owner_bytes=1000)
    assert store.owner_usage("alice") == OwnerUsage(active_jobs=0, stored_bytes=600)

    store.enqueue_job(a.id, "cpu", None, owner="alice", max_owner_active=2)
    store.enqueue_job(a.id, "cpu", None, owner="alice", max_owner_active=2)  # reused
    store.enqueue_job(b.id, "cpu", None, owner="alice", max_owner_active=2)
    with pytest.raises(OverQuota) as over:
        store.enqueue_job(a.id, "cuda", None, owner="alice", max_owner_active=2)
    assert over.value.kind == "active_jobs"
    assert store.owner_usage("alice") == OwnerUsage(active_jobs=2, stored_bytes=600)
    store.enqueue_job(a.id, "cuda", None, owner="bob", max_owner_active=2)  # bob's own quota
    claim = store.claim_job("cpu", "w", {})
    assert claim is not None
    store.complete_job(claim.job.id, claim.lease_token, result())
    assert store.owner_usage("alice").active_jobs == 1  # finished jobs free their place
    store.enqueue_job(a.id, "cuda", None, owner="alice", max_owner_active=2)
    assert store.owner_usage("nobody") == OwnerUsage(active_jobs=0, stored_bytes=0)


def test_concurrent_uploads_of_one_owner_cannot_pass_its_quota_together(
    store: SqlAlchemyStore,
) -> None:
    """Eight threads each store 400 bytes against a quota of 1000: exactly two get in, on
    PostgreSQL (an advisory lock per owner) as on SQLite (serial writes)."""
    barrier = threading.Barrier(8)

    def add(i: int) -> bool:
        barrier.wait(10)
        try:
            store.add_model(f"{i:064x}", f"m{i}", 400, owner="carol", max_owner_bytes=1000)
        except OverQuota:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        stored = list(pool.map(add, range(8)))
    assert stored.count(True) == 2
    assert store.owner_usage("carol").stored_bytes == 800
