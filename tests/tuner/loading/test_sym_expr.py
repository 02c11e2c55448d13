"""fxtune's expression and guard grammars: what torch writes parses to the same value, what an
attacker writes is refused."""

from __future__ import annotations

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.contract.errors import UnsafeArtifactError
from tuner.loading.sym_expr import canonical_expression, check_guard

WRITTEN_BY_TORCH = [
    "Symbol('s26', positive=True, integer=True)",
    "Mul(Integer(2), Symbol('s26', positive=True, integer=True))",
    "GreaterThan(Symbol('u0', integer=True), Integer(0))",
    "LessThan(Symbol('u0', integer=True), Integer(8388608))",
    "FloorDiv(Symbol('s0', integer=True, positive=True), Integer(2))",
    "Add(Integer(1), Mul(Integer(-1), Symbol('s0', integer=True, positive=True)))",
    "Float('1.5', precision=53)",
    "2*s26",
    "(s0//2)",
    "Mod(s0, 3)",
    "(s0 > 2) & (s0 < 9)",
    "Max(2, s0)",
    "Eq(s0, 3)",
    "s0**2",
    "1 - s0",
    "true",
]
ATTACKS = [
    "(exec('import os') or 0)*0+16",
    "__import__('os').system('id')",
    "s0.__class__",
    "Symbol('os')",
    'Symbol("s0")',
    "lambda: 0",
    "s0 if s0 else s1",
    "[s0 for s0 in ()]",
    "PowByNatural(10, 1000000000)",
    "LShift(1, 99999)",
    "10**10**9",
    "s0 < s1 < s2",
    "u99999999",
    "9" * 30,
    "(" * 100 + "s0" + ")" * 100,
    "x" * 20_000,
    "s0; s1",
    "s0\ns1",
]


@pytest.mark.parametrize("text", WRITTEN_BY_TORCH)
def test_what_torch_writes_keeps_its_value(text: str) -> None:
    out = canonical_expression(text)
    assert sympy.sympify(out) == sympy.sympify(text)
    assert canonical_expression(out) == out  # the canonical form is a fixed point


@pytest.mark.parametrize("text", ATTACKS)
def test_what_an_attacker_writes_is_refused(text: str) -> None:
    with pytest.raises(UnsafeArtifactError, match="refused symbolic expression"):
        canonical_expression(text)


_atoms = st.one_of(
    st.integers(0, 10**6).map(str),
    st.integers(0, 50).map(lambda i: f"s{i}"),
    st.integers(0, 50).map(lambda i: f"Symbol('u{i}', integer=True)"),
)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(children, st.sampled_from(["+", "-", "*", "//", "%"]), children).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"
    )
    calls = st.tuples(st.sampled_from(["Max", "Min", "Mod", "FloorDiv"]), children, children).map(
        lambda t: f"{t[0]}({t[1]}, {t[2]})"
    )
    return st.one_of(binary, calls, children.map(lambda c: f"-{c}"))


@settings(max_examples=150, deadline=None)
@given(st.recursive(_atoms, _combine, max_leaves=12))
def test_generated_expressions_keep_their_value(text: str) -> None:
    out = canonical_expression(text)
    locals_ = {"FloorDiv": sympy.Function("FloorDiv"), "Mod": sympy.Function("ModF")}
    try:
        expected = sympy.sympify(text, locals=locals_)
    except (ZeroDivisionError, ValueError) as exc:  # x % 0 fails the same way in both forms
        with pytest.raises(type(exc)):
            sympy.sympify(out, locals=locals_)
        return
    assert sympy.sympify(out, locals=locals_) == expected


GUARDS = [
    "(L['x'].size()[0] % 2) == 0",
    "(8*L['x'].size()[0]) == (16*(L['x'].size()[0] // 2))",
    "2 <= L['x'].size()[0] <= 1024",
    "L['x']['k'].stride()[1] == 1 and not L['y'][0].size()[0] == 3",
]
BAD_GUARDS = [
    "True #\n, 'x')\n  open('/tmp/m', 'w')\n  torch._assert(True",
    "L['x'].size()[0] == 2 or exec('import os')",
    "__import__('os')",
    "L.__class__",
    "L['x'].size()[0] ** 99999",
    "L['x'].__dict__",
    "L[__import__('os')]",
    "(lambda: 1)()",
]


@pytest.mark.parametrize("guard", GUARDS)
def test_guards_torch_writes_pass_the_guard_grammar(guard: str) -> None:
    check_guard(guard)


@pytest.mark.parametrize("guard", BAD_GUARDS)
def test_crafted_guards_are_refused(guard: str) -> None:
    with pytest.raises(UnsafeArtifactError, match="refused guard"):
        check_guard(guard)
