"""Tracking store: an abstract interface and its SQLAlchemy implementation. ORM rows stay inside."""

from service.store.abstract import AbstractStore
from service.store.entities import (
    Claim,
    ConfigSummary,
    Job,
    Model,
    OwnerUsage,
    Profile,
    QueuePolicy,
    StoredConfig,
    TuningResult,
)
from service.store.errors import NotFound, OverQuota, StaleLease, StoreError

__all__ = [
    "AbstractStore",
    "Claim",
    "ConfigSummary",
    "Job",
    "Model",
    "NotFound",
    "OverQuota",
    "OwnerUsage",
    "Profile",
    "QueuePolicy",
    "StaleLease",
    "StoreError",
    "StoredConfig",
    "TuningResult",
]
