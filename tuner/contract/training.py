"""What a training job may ask for, without torch: the optimizers a tuned step can take, and the
phases its profile splits a step into.

`tuner.training.step.OPTIMIZERS` builds them; a test keeps the two lists equal.
"""

OPTIMIZER_NAMES: tuple[str, ...] = ("adamw", "sgd")
# What a training step's profile is split into (`tuner.profiling.analysis`), shown per phase by
# the dashboard.
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
