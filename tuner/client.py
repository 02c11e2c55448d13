"""The documented deployment entry point, kept at its old name: see `tuner.deploy.client`."""

from tuner.deploy.client import FxtuneClientWarning, fetch_config, load_tuned

__all__ = ["FxtuneClientWarning", "fetch_config", "load_tuned"]
