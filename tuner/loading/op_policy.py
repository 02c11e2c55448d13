"""Which operators an uploaded graph may call: tensor arithmetic yes, host effects never.

A program needs no pickle to do harm: `aten.from_file(path, shared=True)` followed by `copy_`
writes attacker bytes to an attacker path when the module runs. So the graph itself is checked,
from the serialized program JSON, before anything is deserialized or run: ATen and prims ops except
the few that touch the host, integer arithmetic on symbolic sizes, and the control-flow
higher-order ops. Custom ops and torchbind objects have unknown semantics and are refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tuner.contract.errors import UnsafeArtifactError

# Functional collectives (all_to_all_single, wait_tensor, ...) only move tensors between the ranks
# of the job's own process group; they touch neither files nor anything outside that group.
ALLOWED_NAMESPACES = ("torch.ops.aten.", "torch.ops.prims.", "torch.ops._c10d_functional.")
HOST_EFFECT_OPS = frozenset({"from_file", "save", "_print", "warn", "record_stream"})
HIGHER_ORDER_OPS = frozenset(
    {
        "cond",
        "while_loop",
        "map_impl",
        "scan",
        "associative_scan",
        "invoke_subgraph",
        "wrap_with_set_grad_enabled",
        "wrap_with_autocast",
    }
)
SYMBOLIC_PREFIXES = ("_operator.", "math.", "torch.sym_", "torch._sym_")
MAX_DEPTH = 200


def _op_name(target: str, namespace: str) -> str:
    return target[len(namespace) :].split(".", 1)[0]


def refusal(target: str) -> str | None:
    """Why `target` (as the serializer spells it) is refused, or None when it is allowed."""
    for namespace in ALLOWED_NAMESPACES:
        if target.startswith(namespace):
            if _op_name(target, namespace) in HOST_EFFECT_OPS:
                return "it reads, writes or prints on the host"
            return None
    if target.startswith("torch.ops.higher_order."):
        name = _op_name(target, "torch.ops.higher_order.")
        return None if name in HIGHER_ORDER_OPS else "an unknown higher-order op"
    if target.startswith(SYMBOLIC_PREFIXES) and target.count(".") <= 1:
        return None
    return (
        "a custom or unknown operator (only ATen, prims, functional collectives and control flow "
        "are accepted)"
    )


def _targets(obj: Any, depth: int = 0) -> Iterator[str]:
    if depth > MAX_DEPTH:
        raise UnsafeArtifactError("refused: the program JSON is nested too deeply")
    if isinstance(obj, dict):
        target = obj.get("target")
        if isinstance(target, str):
            yield target
        elif target is not None:
            raise UnsafeArtifactError("refused: a graph node has a non-string target")
        for value in obj.values():
            yield from _targets(value, depth + 1)
    elif isinstance(obj, list):
        for value in obj:
            yield from _targets(value, depth + 1)


def _custom_objects(obj: Any, depth: int = 0) -> bool:
    if depth > MAX_DEPTH:
        return False
    if isinstance(obj, dict):
        if obj.get("custom_obj_values"):
            return True
        return any(_custom_objects(v, depth + 1) for v in obj.values())
    if isinstance(obj, list):
        return any(_custom_objects(v, depth + 1) for v in obj)
    return False


def check_program_json(program: dict[str, Any]) -> int:
    """Refuse a serialized program that calls any operator outside the policy; returns #nodes."""
    count = 0
    refused: dict[str, str] = {}
    for target in _targets(program.get("graph_module")):
        count += 1
        why = refusal(target)
        if why is not None:
            refused.setdefault(target, why)
    if refused:
        listed = "; ".join(f"{t} ({why})" for t, why in sorted(refused.items())[:5])
        raise UnsafeArtifactError(f"refused: the graph calls operators fxtune won't run: {listed}")
    if _custom_objects(program.get("graph_module")):
        raise UnsafeArtifactError("refused: the graph holds custom (torchbind) objects")
    return count
