"""How large a number each operation of a symbolic-size expression can make, from its parse tree.

sympy evaluates numbers eagerly, and Python's integers have no size limit: each exponent of
`((((99999999999999999999) ** 64) ** 64) ** 64) ** 64` is small, yet the value has about 10^9
bits, and sympy holds a core for minutes computing it (or `floor(1e999) ** 64 ** 64`, or a Float
of a billion bits' precision). So before sympy sees an expression, `tuner.loading.sym_expr` gives
every node of its parse tree a `Size`: bounds on the bits of the numerator and denominator of any
rational value the node can take, with each size symbol anywhere in the 64-bit range (what the
program JSON's integers and range constraints can declare). The rules below are sound over-
estimates (a sum of p1/q1 and p2/q2 is (p1 q2 + p2 q1) / (q1 q2)); the grammar refuses an
expression as soon as one node's bound passes MAX_BITS, so every accepted expression evaluates
with numbers of at most a few thousand bits: microseconds of arithmetic each.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce

MAX_BITS = 8192  # about 2,466 decimal digits, under Python's 4,300-digit int-to-str limit
SYMBOL_BITS = 64  # a size symbol is a 64-bit integer (range constraints are 64-bit)
FLOAT_BITS = 1075  # what a Python float (sympy's RoundDecimal result) needs: 2^1024, 2^-1074


@dataclass(frozen=True)
class Size:
    """|numerator| <= 2**num and 1 <= denominator <= 2**den for every value a node can take;
    `work`: the bits of the largest number evaluating it computes on the way (a product)."""

    num: int
    den: int = 0
    work: int = 0

    @property
    def bits(self) -> int:
        return max(self.num, self.den, self.work)


BOOLEAN = Size(1)
SYMBOL = Size(SYMBOL_BITS)
_DECIMAL = re.compile(r"(\d*)(?:\.(\d*))?(?:e([+-]?\d+))?")


def of_int(value: int) -> Size:
    return Size(max(abs(value).bit_length(), 1))


def of_decimal(text: str) -> Size:
    """A decimal literal (`1.5`, `2e-300`) as the exact rational it spells."""
    m = _DECIMAL.fullmatch(text.lstrip("-"))
    if m is None:
        raise ValueError(f"not a decimal: {text!r}")
    whole, frac, exp = m.group(1) or "", m.group(2) or "", int(m.group(3) or 0)
    mantissa = int(whole + frac or "0")
    scale = exp - len(frac)
    ten = math.ceil(abs(scale) * math.log2(10)) + 1
    num = max(mantissa.bit_length(), 1)
    return Size(num + ten, 0) if scale >= 0 else Size(num, ten)


def add(a: Size, b: Size) -> Size:
    return add_all((a, b))


def add_all(parts: Sequence[Size]) -> Size:
    """A sum over the common denominator: each numerator times the other denominators, plus
    log2(n) bits of carries."""
    if not parts:
        return Size(1)
    den = sum(p.den for p in parts)
    carries = math.ceil(math.log2(len(parts)))
    return Size(max(p.num + den - p.den for p in parts) + carries, den)


def mul(a: Size, b: Size) -> Size:
    return Size(a.num + b.num, a.den + b.den)


def div(a: Size, b: Size) -> Size:
    return Size(a.num + b.den, a.den + b.num)


def to_int(a: Size) -> Size:
    """floor, ceiling, truncation, rounding: |floor(p/q)| <= |p| + 1."""
    return Size(a.num + 1)


def floordiv(a: Size, b: Size) -> Size:
    return to_int(div(a, b))


def mod(a: Size, b: Size) -> Size:
    """|a mod b| <= |b|, over the common denominator q1 q2."""
    return Size(b.num + a.den, a.den + b.den)


def power(a: Size, exponent: int) -> Size:
    """a ** exponent; a negative exponent swaps numerator and denominator."""
    k = abs(exponent)
    if k == 0:
        return Size(1)
    return Size(a.num * k, a.den * k) if exponent > 0 else Size(a.den * k, a.num * k)


def shift_left(a: Size, by: int) -> Size:
    return Size(a.num + max(by, 0), a.den)


def pick(parts: Sequence[Size]) -> Size:
    """Max, Min, Abs, Piecewise, Where: the value is one of the arguments."""
    return Size(max((p.num for p in parts), default=1), max((p.den for p in parts), default=0))


def _fold(op: Callable[[Size, Size], Size]) -> Callable[[Sequence[Size]], Size]:
    return lambda parts: reduce(op, parts) if parts else Size(1)


def _first(rule: Callable[[Size], Size]) -> Callable[[Sequence[Size]], Size]:
    return lambda parts: rule(parts[0]) if parts else Size(1)


def _pair(rule: Callable[[Size, Size], Size]) -> Callable[[Sequence[Size]], Size]:
    def apply(parts: Sequence[Size]) -> Size:
        if len(parts) == 1:
            return parts[0]
        return reduce(rule, parts) if parts else Size(1)

    return apply


def _modular_indexing(parts: Sequence[Size]) -> Size:
    """ModularIndexing(x, d, m) = (x // d) % m."""
    if len(parts) != 3:
        return _everything(parts)
    return mod(floordiv(parts[0], parts[1]), parts[2])


def _dense_indicator(parts: Sequence[Size]) -> Size:
    """0 or 1, but torch's evaluation multiplies the sizes together on the way."""
    return Size(1, 0, _fold(mul)(parts).num)


def _round_decimal(parts: Sequence[Size]) -> Size:
    return Size(FLOAT_BITS, FLOAT_BITS)


def _everything(parts: Sequence[Size]) -> Size:
    """For an unexpected arity: as if every argument were multiplied and added."""
    return add(_fold(mul)(parts), Size(1)) if parts else Size(1)


def _boolean(parts: Sequence[Size]) -> Size:
    return BOOLEAN


_COMPARISONS = (
    "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Equality", "Unequality", "StrictLessThan",
    "StrictGreaterThan", "LessThan", "GreaterThan", "And", "Or", "Not",
)  # fmt: skip
# The value a call can take, from its arguments' sizes, by function name. Pow, LShift and the
# other functions with a literal exponent are sized by the grammar (`power`, `shift_left`).
FUNCTION_SIZES: dict[str, Callable[[Sequence[Size]], Size]] = {
    "Integer": _first(to_int),
    "Rational": _pair(div),
    "Add": add_all,
    "Mul": _fold(mul),
    "Max": pick,
    "Min": pick,
    "Abs": pick,
    "Identity": pick,
    "Piecewise": pick,
    "ExprCondPair": pick,
    "Where": pick,
    "Mod": _pair(mod),
    "PythonMod": _pair(mod),
    "ModularIndexing": _modular_indexing,
    "floor": _first(to_int),
    "ceiling": _first(to_int),
    "FloorToInt": _first(to_int),
    "CeilToInt": _first(to_int),
    "TruncToInt": _first(to_int),
    "RoundToInt": _first(to_int),
    "TruncToFloat": _first(to_int),
    "ToFloat": pick,
    "FloorDiv": _pair(floordiv),
    "CeilDiv": _pair(floordiv),
    "CleanDiv": _pair(floordiv),
    "IntTrueDiv": _pair(div),
    "FloatTrueDiv": _pair(div),
    "RoundDecimal": _round_decimal,
    "IsNonOverlappingAndDenseIndicator": _dense_indicator,
    **dict.fromkeys(_COMPARISONS, _boolean),
}


def of_call(name: str, parts: Sequence[Size]) -> Size | None:
    """The size of `name(*parts)`, or None for a function without a rule (refused)."""
    rule = FUNCTION_SIZES.get(name)
    return None if rule is None else rule(parts)
