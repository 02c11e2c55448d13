"""fxtune's expression and guard grammars: what torch writes parses to the same value, what an
attacker writes is refused."""

from __future__ import annotations

import functools
import signal
import time

import pytest
import sympy
import torch.utils._sympy.functions as sympy_functions
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.contract.errors import UnsafeArtifactError
from tuner.loading.expr_size import FUNCTION_SIZES
from tuner.loading.sym_expr import (
    EXPONENT_FUNCTIONS,
    FUNCTIONS,
    canonical_expression,
    check_guard,
)

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


# Each exponent, literal and nesting is within the grammar's own caps; the numbers they make
# are not (the first is issue 47's: sympy evaluated it for minutes).
NUMBER_BOMBS = [
    "((((99999999999999999999) ** 64) ** 64) ** 64) ** 64",
    "Pow(Pow(Pow(99999999999999999999, 64), 64), 64)",
    "PowByNatural(PowByNatural(99999999999999999999, 64), 64)",
    "FloatPow(FloatPow(99999999999999999999, 64), 64)",
    "(s0 ** 64) ** 64",
    "((s0 * s1) ** 64) ** 2",
    "floor(1e999) ** 64",
    "floor(1e-999 ** -64)",
    "CeilToInt(Float('1e999') ** 64)",
    "Mul(99999999999999999999 ** 64, 99999999999999999999 ** 64)",
    "(1 / 99999999999999999999) ** 64 * (1 / 99999999999999999999) ** 64",
    "LShift(99999999999999999999 ** 64, 64) * 99999999999999999999 ** 64",
    "IsNonOverlappingAndDenseIndicator(s0 ** 64, s1 ** 64, s2 ** 64, 1)",
    "Float('1.5', precision=100000000)",
]


@pytest.mark.parametrize("text", NUMBER_BOMBS)
def test_numbers_too_large_to_evaluate_are_refused_in_milliseconds(text: str) -> None:
    started = time.perf_counter()
    with pytest.raises(UnsafeArtifactError, match="bits"):
        canonical_expression(text)
    assert time.perf_counter() - started < 0.1


def test_the_largest_numbers_torch_could_write_pass() -> None:
    """A 64-bit size to the 64th power, a product of 30 sizes, a sum of products: accepted."""
    for text in ("s0 ** 64", "Mul(" + ", ".join(f"s{i}" for i in range(30)) + ")",
                 "Add(" + ", ".join(f"s{i} * s{i + 1}" for i in range(15)) + ")"):  # fmt: skip
        canonical_expression(text)


def _nest(levels: int, pattern: str) -> str:
    inner = "s0"
    for i in range(levels):
        inner = pattern.format(inner=inner, i=i + 1, j=i + 2)
    return inner


def _wide_max(levels: int, width: int) -> str:
    inner = "s0"
    for i in range(levels):
        terms = ", ".join(f"s{(i * width + j) % 900 + 1}" for j in range(width))
        inner = f"Max({inner}, Add({terms}))"
    return inner


# No large number, yet sympy's simplification as it parses took this long on each (plain
# `sympify` with torch's functions, 2-core machine, torch 2.13's sympy): Max and Min compare
# their arguments pairwise, Mod looks for common factors of expanded products.
SLOW_TO_SIMPLIFY = {
    "30 nested Max (2.7 s)": _nest(30, "Max({inner}, s{i})"),
    "a Max of 32 sums (0.4 s)": "Max(" + ", ".join(f"s{i} + s{i + 1}" for i in range(32)) + ")",
    "20 nested Max of sums (2.2 s)": _nest(20, "Max({inner}, s{i} + s{j} + s{i} * s{j})"),
    "20 nested Max of 40-term sums (26 s)": _wide_max(20, 40),
    "Mod of a product of sums (1.2 s)": (
        "(Add(s27, Min(6951996970, s53), FloorDiv(411881853592022, 525085797557)) % "
        "Mul(Add(s13, s20, s26, s16, s28, s19, s7, 2502, s34), Mul(312062, s2, s21, s18, s39), "
        "Add(s53, s57, 15825605923516360, 302082, s39, s37, s31, s23)))"
    ),
}


@pytest.mark.parametrize("text", SLOW_TO_SIMPLIFY.values(), ids=SLOW_TO_SIMPLIFY.keys())
def test_expressions_slow_to_simplify_are_refused_in_milliseconds(text: str) -> None:
    started = time.perf_counter()
    with pytest.raises(UnsafeArtifactError, match="refused symbolic expression"):
        canonical_expression(text)
    assert time.perf_counter() - started < 0.1


def test_every_accepted_function_has_a_size_rule() -> None:
    sized = set(FUNCTION_SIZES) | EXPONENT_FUNCTIONS | {"Symbol", "Dummy", "Float"}
    assert sized >= FUNCTIONS


# sympy with the functions torch's deserializer gives it (its `sympy_functions`).
TORCH_FUNCTIONS = {
    name: getattr(sympy_functions, name)
    for name in (
        "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
        "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv",
        "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
        "RoundToInt", "RoundDecimal", "ToFloat", "Identity",
    )
}  # fmt: skip
_big_atoms = st.one_of(
    st.integers(0, 10**20 - 1).map(str),
    st.sampled_from(["1e300", "1e-300", "2.5", "Float('1e99', precision=53)", "oo"]),
    st.integers(0, 40).map(lambda i: f"s{i}"),
)


def _grow(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(children, st.sampled_from(["+", "*", "/", "//", "%"]), children).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"
    )
    powers = st.tuples(children, st.sampled_from([2, 8, 33, 64, -64])).map(
        lambda t: f"(({t[0]}) ** {t[1]})" if t[1] > 0 else f"Pow({t[0]}, {t[1]})"
    )
    calls = st.tuples(
        st.sampled_from(["Max", "Min", "Mod", "FloorDiv", "PythonMod", "CeilDiv", "Mul", "Add"]),
        children,
        children,
    ).map(lambda t: f"{t[0]}({t[1]}, {t[2]})")
    unary = st.tuples(st.sampled_from(["floor", "CeilToInt", "ToFloat", "Abs"]), children).map(
        lambda t: f"{t[0]}({t[1]})"
    )
    return st.one_of(binary, powers, powers, calls, unary)


_WRAPPERS = [
    "(({}) ** 64)", "(({}) ** 64)", "(({}) ** 33)", "floor({})", "Mod({}, s1)", "({} * s2)",
    "FloorDiv({}, 3)", "({} + 1e300)", "Max({}, s3)", "(1 / ({}))",
]  # fmt: skip
# Chains of operations on one atom: where towers of powers come from.
_chains = st.tuples(_big_atoms, st.lists(st.sampled_from(_WRAPPERS), min_size=1, max_size=6)).map(
    lambda t: functools.reduce(lambda inner, wrap: wrap.format(inner), t[1], t[0])
)


class _Overran(Exception):
    pass


def _evaluate_within(seconds: float, text: str, values: dict[str, int]) -> None:
    """Parse as torch's deserializer does, then substitute the sizes as the bounds check does;
    raise _Overran past `seconds` (an alarm: a broken bound would otherwise hang the test)."""

    def overran(*_: object) -> None:
        raise _Overran(text)

    previous = signal.signal(signal.SIGALRM, overran)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        expr = sympy.sympify(text, locals=TORCH_FUNCTIONS)
        if isinstance(expr, sympy.Basic):
            expr.xreplace({s: sympy.Integer(values[s.name]) for s in expr.free_symbols})
    except _Overran:
        raise
    except Exception:  # x / 0, arithmetic on booleans: fails quickly, in either form
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(_chains, st.recursive(_big_atoms, _grow, max_leaves=10)),
    st.lists(st.integers(1, 2**63 - 1), min_size=4, max_size=4),
)
def test_accepted_expressions_evaluate_quickly_and_the_rest_are_refused_quickly(
    text: str, sizes: list[int]
) -> None:
    started = time.perf_counter()
    try:
        out = canonical_expression(text)
    except UnsafeArtifactError:
        assert time.perf_counter() - started < 0.1
        return
    _evaluate_within(1.0, out, {f"s{i}": sizes[i % len(sizes)] for i in range(41)})


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
