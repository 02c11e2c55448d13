"""What a training job may ask for, without torch: the optimizers a tuned step can take.

`tuner.training.step.OPTIMIZERS` builds them; a test keeps the two lists equal.
"""

OPTIMIZER_NAMES: tuple[str, ...] = ("adamw", "sgd")
