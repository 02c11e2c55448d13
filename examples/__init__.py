"""Example models shipped with fxtune, used by the demo, the benchmark and the tests."""

from examples.models import EXAMPLES, Example

__all__ = ["EXAMPLES", "Example"]
