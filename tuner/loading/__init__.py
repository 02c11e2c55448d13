"""Untrusted `.pt2` archives to `ExportedProgram`s without running anything they carry: the zip
allowlist, the strict program schema, the symbolic-size grammar, the op policy, resource bounds."""
