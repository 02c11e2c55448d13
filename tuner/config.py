"""The documented config names, kept at their old place: the schema is `tuner.contract.config`,
replaying it `tuner.deploy.replay`."""

from tuner.contract.config import SCHEMA_VERSION, Bucket, PassStep, SiteDecision, TunedConfig
from tuner.deploy.replay import apply_buckets, apply_config

__all__ = [
    "SCHEMA_VERSION",
    "Bucket",
    "PassStep",
    "SiteDecision",
    "TunedConfig",
    "apply_buckets",
    "apply_config",
]
