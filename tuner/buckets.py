"""The documented size-dispatch name, kept at its old place: see `tuner.deploy.dispatch`."""

from tuner.deploy.dispatch import SizeDispatch

__all__ = ["SizeDispatch"]
