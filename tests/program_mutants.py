"""Mutations of a program's JSON for the fuzzers: payloads of each class of attack for strings
(code in expressions, guards and names; quotes, newlines, huge text), extremes for numbers, and
unknown keys for objects. Shared by the loader fuzzer (tests/tuner/loading/test_program_fuzz.py)
and the upload fuzzer (tests/service/test_upload_fuzz.py)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Path_ = tuple[Any, ...]


def payloads(marker: Path) -> list[str]:
    code = f"open({str(marker)!r}, 'w').write('pwned')"
    hexed = ", ".join(str(b) for b in code.encode())
    return [
        f"(exec({code!r}) or 0)*0 + 16",
        f"__import__('builtins').exec({code!r})",
        f"Symbol('s0') + exec({code!r})",
        f'True #\n, "x")\n  {code}\n  torch._assert(True',
        f"L['x'].size()[0] == 2 or exec({code!r})",
        f'w", exec(bytes(({hexed},)))) or getattr(self, "w',
        f"x\n{code}\n",
        'a"b',
        "a'b",
        "s0 ** 99999999",
        "PowByNatural(10, 999999999)",
        "9" * 5000,
        "u99999999999",
        "",
        "é" * 3,
        "torch.ops.aten.from_file.default",
        "torch.ops.evil.op.default",
        "builtins.eval",
        '[1, {"type": "collections.defaultdict", "context": "{}", "children_spec": []}]',
        "x" * 100_000,
    ]


NUMBERS = [0, -1, 1, 2**31, 2**63 - 1, -(2**63), 2**64, 10**30, 1.5, None, True, "NaN"]


def leaves(obj: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    if isinstance(obj, dict):
        yield path, obj
        for k, v in obj.items():
            yield (*path, ("key", k)), k
            yield from leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from leaves(v, (*path, i))
    else:
        yield path, obj


def set_at(obj: Any, path: Path_, value: Any) -> None:
    *parents, last = path
    for p in parents:
        obj = obj[p]
    if isinstance(last, tuple) and last[0] == "key":
        obj[value if isinstance(value, str) else str(value)] = obj.pop(last[1])
    elif isinstance(obj[last], dict) and not isinstance(value, dict):
        obj[last]["fxtune_fuzz_unknown_key"] = value
    else:
        obj[last] = value


def mutate(program: dict[str, Any], rng: random.Random, marker: Path) -> dict[str, Any]:
    """A copy of `program` with one to three random mutations (for fuzzers without hypothesis)."""
    mutant = json.loads(json.dumps(program))
    spots = [(p, v) for p, v in leaves(program) if p]
    for _ in range(rng.randint(1, 3)):
        path, old = rng.choice(spots)
        pool = payloads(marker) if isinstance(old, str) else NUMBERS + payloads(marker)[:3]
        try:
            set_at(mutant, path, rng.choice(pool))
        except (KeyError, IndexError, TypeError):
            continue
    return mutant
