"""What fxtune promises to the outside, importable without torch: the tuned config's schema,
modes, verdicts, devices, errors and exit codes. The service, the worker and a deployment read
these; everything else in `tuner` builds on them."""
