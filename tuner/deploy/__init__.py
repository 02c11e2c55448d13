"""The deployment side: fetch a tuned config, replay it on the original program, dispatch
per size bucket, and fall back to the untuned module on any doubt."""
