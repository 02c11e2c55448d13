"""What a tuning (or checking) child may see of its parent, and what may come back from it.

The child runs untrusted programs, so it gets an environment built from an allowlist, never the
parent's whole `os.environ`: a worker's FXTUNE_WORKER_TOKEN, a service's database URL or API
token would otherwise be one `os.environ` away. And whatever the child prints is untrusted text
that the worker relays to the service (progress, errors): it is cut to a bounded length and the
relaying process's own secrets are masked in it, whether the child could have known them or not.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from tuner.contract.errors import ALLOW_UNCHECKED_TORCH_ENV
from tuner.host.failures import STRICT_ENV

# Passed through when the parent has them: what Python, torch and its native libraries read.
ALLOWED_NAMES = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "USER",
        "LOGNAME",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "PJRT_DEVICE",
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        STRICT_ENV,  # fxtune's own: unexpected exceptions raise rather than fall back
        ALLOW_UNCHECKED_TORCH_ENV,  # the operator's override: children run the same torch
    }
)
ALLOWED_PREFIXES = (
    "LC_",  # locale
    "OMP_",  # thread counts and pinning: OpenMP, MKL, OpenBLAS, Intel's runtime
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "CUDA_",  # CUDA, cuDNN/cuBLAS and NCCL settings
    "CUDNN_",
    "CUBLAS_",
    "NCCL_",
    "NVIDIA_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "XLA_",
    "TPU_",
)
# A variable whose name holds one of these never reaches a child, allowlisted or passed.
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "DATABASE", "CREDENTIAL", "API_KEY")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
MAX_PROGRESS_CHARS = 500
MAX_ERROR_CHARS = 4000
REDACTED = "[redacted]"


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def allowed(name: str) -> bool:
    if is_secret_name(name):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def private_temp_env(workdir: Path) -> dict[str, str]:
    """Point every temporary and cache folder the tuner's stack uses into the job's folder."""
    tmp = workdir / "tmp"
    tmp.mkdir(exist_ok=True)
    return {
        "TMPDIR": str(tmp),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
        "TRITON_CACHE_DIR": str(tmp / "triton"),
        "XDG_CACHE_HOME": str(tmp / "cache"),
    }


def child_environment(
    workdir: Path,
    passed: Mapping[str, str] | None = None,
    parent: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The allowlisted part of `parent` (default: os.environ), HOME and the temporary folders in
    the job's folder, then what the caller passes explicitly; names that look secret are dropped
    from both."""
    parent = os.environ if parent is None else parent
    env = {name: value for name, value in parent.items() if allowed(name)}
    env.setdefault("PATH", DEFAULT_PATH)
    env["HOME"] = str(workdir)
    env.update(private_temp_env(workdir))
    env.update({k: v for k, v in (passed or {}).items() if not is_secret_name(k)})
    env["PYTHONUNBUFFERED"] = "1"
    return env


# A match starts only where a run of scheme characters starts: starting anywhere inside a run
# made searching a long run of letters (a child's stderr) quadratic, 25 s of CPU for 64 KB.
_URL_PASSWORD = re.compile(r"(?<![\w+.-])(?P<scheme>[\w+.-]+://[^/\s:@]*):(?P<password>[^/\s@]+)@")


class Redactor:
    """Masks known secret values (and passwords written into URLs) in text; cuts it to a length.

    Secrets shorter than 6 characters are not masked: they would mask ordinary words."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        found = {s for s in secrets if s and len(s) >= 6}
        for s in list(found):
            match = _URL_PASSWORD.search(s)
            if match and len(match["password"]) >= 6:
                found.add(match["password"])
        self.secrets = tuple(sorted(found, key=len, reverse=True))  # longest first

    @classmethod
    def of_environment(
        cls, environ: Mapping[str, str] | None = None, extra: Iterable[str | None] = ()
    ) -> Redactor:
        """Every value of this process's variables with a secret-looking name, and `extra`."""
        environ = os.environ if environ is None else environ
        return cls([v for k, v in environ.items() if is_secret_name(k)] + list(extra))

    def __call__(self, text: str, limit: int | None = None) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        text = _URL_PASSWORD.sub(rf"\g<scheme>:{REDACTED}@", text)
        if limit is not None and len(text) > limit:
            text = text[: limit - 3] + "..."
        return text


PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3


def undumpable() -> bool:
    """Make this process undumpable: its memory, `/proc/<pid>/environ` (which keeps the
    environment it started with, tokens included, whatever `os.environ` holds later) and ptrace
    are then closed to processes of the same user that lack CAP_SYS_PTRACE, such as a tuning
    child run without a sandbox. Its children start dumpable again (execve resets the flag).
    Whether it took (not on a system without prctl)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        return libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def fxtune_python_path(existing: str | None = None) -> str:
    """A PYTHONPATH under which a child imports this very fxtune: the folder holding the running
    `tuner` package first, then `existing`. Otherwise whatever install the interpreter finds
    first (an editable install of another checkout, an older wheel) would check or compile
    with other code than the parent's."""
    root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (root, existing) if p)
