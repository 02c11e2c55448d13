"""The bounds on the numbers each operation makes are sound: checked against exact rationals."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.loading import expr_size
from tuner.loading.expr_size import Size

_rationals = st.builds(
    Fraction,
    st.integers(-(2**80), 2**80),
    st.integers(1, 2**40),
)


def size_of(x: Fraction) -> Size:
    """The tightest Size holding x: |p| <= 2**num, q <= 2**den."""
    return Size(max(abs(x.numerator).bit_length(), 1), (x.denominator - 1).bit_length())


def holds(x: Fraction, bound: Size) -> bool:
    return abs(x.numerator) <= 2**bound.num and x.denominator <= 2**bound.den


@settings(max_examples=300, deadline=None)
@given(_rationals, _rationals, st.integers(-6, 6))
def test_each_operation_stays_within_its_bound(a: Fraction, b: Fraction, k: int) -> None:
    sa, sb = size_of(a), size_of(b)
    assert holds(a + b, expr_size.add(sa, sb))
    assert holds(a - b, expr_size.add(sa, sb))
    assert holds(a * b, expr_size.mul(sa, sb))
    assert holds(Fraction(math.floor(a)), expr_size.to_int(sa))
    if b:
        assert holds(a / b, expr_size.div(sa, sb))
        assert holds(Fraction(a // b), expr_size.floordiv(sa, sb))
        assert holds(a % b, expr_size.mod(sa, sb))
    if a or k >= 0:
        assert holds(a**k, expr_size.power(sa, k))


@settings(max_examples=100, deadline=None)
@given(st.lists(_rationals, min_size=1, max_size=12))
def test_a_sum_of_many_stays_within_its_bound(parts: list[Fraction]) -> None:
    assert holds(sum(parts, Fraction(0)), expr_size.add_all([size_of(p) for p in parts]))
    assert holds(max(parts), expr_size.pick([size_of(p) for p in parts]))


def test_decimal_literals_are_sized_as_the_rationals_they_spell() -> None:
    for text in ("1.5", "2e-300", "1e999", "0.000125", "123456789.987654321", "7"):
        assert holds(Fraction(text), expr_size.of_decimal(text)), text
