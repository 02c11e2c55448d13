"""The allowlist of operators' string arguments, against every schema this torch registers."""

from __future__ import annotations

import pytest
import torch

from tuner.contract.errors import UnsafeArtifactError
from tuner.contract.op_strings import (
    EINSUM,
    STRING_ARGUMENTS,
    Grammar,
    OneOf,
    Replaced,
    canonical_argument,
    checked_argument,
    operator_key,
)
from tuner.loading.op_policy import refusal

BREAKERS = ['"', "\\", "\n", "\r", "*/", "\0"]
NAMESPACES = ("aten", "prims", "_c10d_functional")


def _string_arguments() -> set[tuple[str, str]]:
    """(namespace.operator, argument) of every argument that can hold a string, by schema
    (`Any` too: the functional collectives' group names)."""
    found = set()
    for schema in torch._C._jit_get_all_schemas():
        namespace, _, name = schema.name.partition("::")
        if namespace not in NAMESPACES:
            continue
        for argument in schema.arguments:
            kind = str(argument.type)
            if "str" in kind or (kind == "Any" and argument.name == "group_name"):
                found.add((f"{namespace}.{name}", argument.name))
    return found


def test_every_rule_names_a_real_argument() -> None:
    known = _string_arguments()
    assert set(STRING_ARGUMENTS) <= known, sorted(set(STRING_ARGUMENTS) - known)


def test_string_arguments_without_a_rule_are_refused() -> None:
    """Fail closed: an operator the policy accepts but whose string argument has no rule."""
    unruled = sorted(_string_arguments() - set(STRING_ARGUMENTS))
    accepted = [(op, arg) for op, arg in unruled if refusal(f"torch.ops.{op}.default") is None]
    assert len(accepted) > 50  # torch's string and dict ops, sparse reductions, ...
    for op, arg in accepted:
        with pytest.raises(UnsafeArtifactError, match="no string"):
            checked_argument(f"torch.ops.{op}.default", arg, "sum")


@pytest.mark.parametrize("key", sorted(STRING_ARGUMENTS), ids="::".join)
def test_no_payload_passes_any_rule(key: tuple[str, str]) -> None:
    op, arg = key
    target = f"torch.ops.{op}.default"
    rule = STRING_ARGUMENTS[key]
    values = sorted(rule.values) if isinstance(rule, OneOf) else ["sum", "ij"]
    for payload in BREAKERS:
        for value in values:
            try:
                kept = checked_argument(target, arg, value + payload)
            except UnsafeArtifactError:
                continue
            assert isinstance(rule, Replaced) and payload == "*/", (key, payload)
            assert kept == rule.text


def _shown_values(rule: OneOf | Grammar | Replaced) -> list[str]:
    if isinstance(rule, OneOf):
        return sorted(rule.values)
    return [rule.text] if isinstance(rule, Replaced) else []


def test_accepted_values_hold_nothing_that_ends_a_literal() -> None:
    for rule in STRING_ARGUMENTS.values():
        for value in _shown_values(rule):
            assert not any(b in value for b in [*BREAKERS, "'", "{", "}"]), value
        if isinstance(rule, Grammar):
            assert not any(rule.pattern.fullmatch(f"ab{b}") for b in BREAKERS)


@pytest.mark.parametrize("equation", ["ij,jk->ik", "...ij,...jk->...ik", "bij, bjk", "ii", "i->"])
def test_einsum_equations_pass(equation: str) -> None:
    assert EINSUM(equation) == equation


@pytest.mark.parametrize("equation", ["ij;jk", "i j->k\n", "ij->ik->k", "....i", "ij,jk->ik'"])
def test_other_einsum_strings_do_not(equation: str) -> None:
    with pytest.raises(UnsafeArtifactError):
        EINSUM(equation)


def test_keys_from_serialized_targets_and_overloads_agree() -> None:
    assert operator_key("torch.ops.aten.gelu.default") == "aten.gelu"
    assert operator_key(str(torch.ops.aten.gelu.default)) == "aten.gelu"
    assert operator_key("torch.ops._c10d_functional.all_reduce.default") == (
        "_c10d_functional.all_reduce"
    )


def test_fingerprints_hash_messages_as_the_loader_keeps_them() -> None:
    target = torch.ops.aten._assert_scalar.default
    rule = STRING_ARGUMENTS[("aten._assert_scalar", "assert_msg")]
    assert isinstance(rule, Replaced)
    assert canonical_argument(target, "assert_msg", "anything") == rule.text
    assert canonical_argument(torch.ops.aten.gelu.default, "approximate", "tanh") == "tanh"
