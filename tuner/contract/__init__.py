"""What fxtune promises to the outside, importable without torch: the tuned config's schema,
modes, verdicts, devices, errors and exit codes, and the string arguments an uploaded graph may
pass to an operator. The service, the worker and a deployment read
these; everything else in `tuner` builds on them."""
