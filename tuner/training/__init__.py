"""A training step of an exported program (forward, loss, backward, optimizer step) and the
checks that a rewritten step trains as the original does."""
