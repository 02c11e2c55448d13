"""Tracking store: an abstract interface and its SQLAlchemy implementation. ORM rows stay inside."""

from service.store.abstract import AbstractStore
from service.store.entities import (
    Claim,
    ConfigSummary,
    Job,
    Model,
    Profile,
    QueuePolicy,
    StoredConfig,
    TuningResult,
)
from service.store.errors import NotFound, StaleLease, StoreError

__all__ = [
    "AbstractStore",
    "Claim",
    "ConfigSummary",
    "Job",
    "Model",
    "NotFound",
    "Profile",
    "QueuePolicy",
    "StaleLease",
    "StoreError",
    "StoredConfig",
    "TuningResult",
]
