"""The checks the service runs on untrusted programs, in a sandboxed child: an upload's
fingerprint and bounds, and a worker's result against the upload."""
