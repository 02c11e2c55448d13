"""Where and what to try: the per-site search, the decision store it fills, verdicts across
sizes, and size buckets."""
