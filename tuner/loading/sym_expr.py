"""fxtune's own grammar for the symbolic-size expressions in a program JSON.

torch's deserializer hands every `expr_str` to `sympy.sympify`, which `eval`s it with Python's
builtins in scope: `(exec(...) or 0)*0+16` runs and still evaluates to 16. So an upload's
expression text never reaches sympy as written. It is tokenized and parsed here against a small
grammar (integers, decimals, size symbols such as `s0` and `u3`, the arithmetic, comparison and
boolean operators, and calls of an allowlisted set of sympy and torch functions, in either the
`str` or the `srepr` form torch writes), then printed back from the parse tree, fully
parenthesized. Only that printed text goes on to torch. Exponents and shifts are limited to small
literals, since sympy evaluates `10**10**9` or `LShift(1, 10**9)` eagerly; length, depth and
symbol numbers are capped. Small exponents still compound (`(((10**20)**64)**64)**64` has 10^9
bits), so each part of the parse tree is also sized (`tuner.loading.expr_size`: the bits of any
number it can make, every size symbol in the 64-bit range) and an expression with a part past
`expr_size.MAX_BITS` is refused before sympy sees it. sympy also simplifies as it parses (Max
compares its arguments pairwise, Mod factors), so the numbers and symbols, the calls of those
functions, a Max's arguments and the monomials their arguments expand to are capped too.

The grammar, precisely (Python's operator precedence, one comparison per level, no chaining):

    expr    := bitor [compare-op bitor]
    bitor   := bitand ('|' bitand)*
    bitand  := arith ('&' arith)*
    arith   := term (('+' | '-') term)*
    term    := unary (('*' | '/' | '//' | '%') unary)*
    unary   := ('-' | '+' | '~') unary | power
    power   := atom ['**' small-int]
    atom    := INT | DECIMAL | SYMBOL | CONSTANT | '(' expr ')' | FUNCTION '(' args ')'
    SYMBOL  := one of torch's size-symbol prefixes followed by 1-7 digits (s0, u12, zf3, ...)
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from tuner.contract.errors import UnsafeArtifactError
from tuner.loading import expr_size
from tuner.loading.expr_size import Size

MAX_LENGTH = 16_384
MAX_DEPTH = 64
MAX_INT_DIGITS = 20
MAX_EXPONENT = 64
MAX_SYMBOL_INDEX = 1_000_000
MAX_PRECISION = 1024  # a Float's bits (torch writes 53); sympy takes seconds at a million
# sympy simplifies as it builds: Max and Min compare their arguments pairwise (a Max of 32 sums
# took 0.4 s, 30 nested Max 2.7 s), Mod and floor division look for common factors.
# torch writes a handful of each; these caps keep every accepted expression to milliseconds.
MAX_ATOMS = 32  # numbers and symbols in one expression
MAX_SIMPLIFYING = 12  # calls of SIMPLIFYING functions, `//` and `%` included
MAX_MINMAX_ARGS = 4  # arguments of one Max or Min, nested ones of its kind flattened in
MAX_TERMS = 8  # monomials an argument of a SIMPLIFYING function can expand to
TERMS_CAP = 10**6
SIMPLIFYING = frozenset(
    {
        "Max", "Min", "Mod", "PythonMod", "FloorDiv", "CeilDiv", "CleanDiv", "ModularIndexing",
        "Piecewise", "Where", "floor", "ceiling",
    }
)  # fmt: skip

SYMBOL = re.compile(r"(s|u|zf|zuf|ps|tmp|idx|i|x|y|z|q|r|c|h|view|indirect|r0_|r1_)(\d{1,7})")
DECIMAL = re.compile(r"\d{1,20}\.\d{0,20}(e[+-]?\d{1,3})?|\d{1,20}e[+-]?\d{1,3}")
CONSTANTS = frozenset({"true", "false", "True", "False", "oo", "zoo", "nan"})
# Calls whose arguments are expressions: sympy's, and the functions torch's deserializer adds.
FUNCTIONS = frozenset(
    {
        "Integer", "Rational", "Add", "Mul", "Max", "Min", "Abs", "Mod", "floor", "ceiling",
        "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Equality", "Unequality", "StrictLessThan",
        "StrictGreaterThan", "LessThan", "GreaterThan", "And", "Or", "Not", "Piecewise",
        "ExprCondPair", "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv",
        "CeilToInt", "FloorToInt", "CeilDiv", "IntTrueDiv", "FloatTrueDiv", "ToFloat",
        "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "Identity",
        "IsNonOverlappingAndDenseIndicator", "Pow", "PowByNatural", "FloatPow", "LShift",
        "RShift", "Symbol", "Dummy", "Float",
    }
)  # fmt: skip
# Functions whose second argument is an exponent or shift: it must be a small literal.
EXPONENT_FUNCTIONS = frozenset({"Pow", "PowByNatural", "FloatPow", "LShift", "RShift"})
ASSUMPTIONS = frozenset(
    {
        "integer", "positive", "nonnegative", "negative", "nonpositive", "real", "finite",
        "zero", "nonzero", "even", "odd", "rational", "extended_real", "extended_positive",
        "extended_nonnegative", "commutative", "infinite", "prime", "composite",
    }
)  # fmt: skip
COMPARISONS = ("<=", ">=", "==", "!=", "<", ">")
_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:e[+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<str>'[^'\\\n]{0,64}')|(?P<op>\*\*|//|<=|>=|==|!=|[-+*/%<>&|~(),=]))"
)


@dataclass(frozen=True)
class Tok:
    kind: str  # num | name | str | op | end
    text: str


def _refuse(text: str, why: str, what: str = "symbolic expression") -> UnsafeArtifactError:
    shown = text if len(text) <= 80 else text[:77] + "..."
    return UnsafeArtifactError(f"refused {what} {shown!r}: {why}")


def _tokens(text: str) -> list[Tok]:
    out: list[Tok] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _refuse(text, f"unexpected character {text[pos:].lstrip()[:1]!r}")
        kind = m.lastgroup or "op"
        out.append(Tok(kind, m.group(kind)))
        pos = m.end()
    out.append(Tok("end", ""))
    return out


def check_symbol(name: str, text: str) -> str:
    m = SYMBOL.fullmatch(name)
    if m is None:
        raise _refuse(text, f"{name!r} is not a size symbol")
    if int(m.group(2)) > MAX_SYMBOL_INDEX:
        raise _refuse(text, f"symbol number {m.group(2)} is out of range")
    return name


@dataclass(frozen=True)
class Part:
    """A parsed part: its canonical text, how large a number it can be (`expr_size`) and, for a
    Max or Min call, how many arguments sympy sees once it flattens nested ones of its kind."""

    text: str
    size: Size
    minmax: tuple[str, int] | None = None
    terms: int = 1  # monomials once expanded, at most (capped at TERMS_CAP)


_BINARY_SIZES: dict[str, Callable[[Size, Size], Size]] = {
    "+": expr_size.add,
    "-": expr_size.add,
    "*": expr_size.mul,
    "/": expr_size.div,
    "//": expr_size.floordiv,
    "%": expr_size.mod,
    "|": expr_size.add,
    "&": expr_size.add,
}
_UNARY_SIZES: dict[str, Callable[[Size], Size]] = {
    "-": lambda a: a,
    "+": lambda a: a,
    "~": lambda a: expr_size.add(a, Size(1)),
}


_BINARY_TERMS: dict[str, Callable[[Part, Part], int]] = {
    "+": lambda a, b: min(a.terms + b.terms, TERMS_CAP),
    "-": lambda a, b: min(a.terms + b.terms, TERMS_CAP),
    "*": lambda a, b: min(a.terms * b.terms, TERMS_CAP),
    "/": lambda a, b: min(a.terms * b.terms, TERMS_CAP),
    "//": lambda a, b: 1,
    "%": lambda a, b: 1,
    "|": lambda a, b: 1,
    "&": lambda a, b: 1,
}
# How calls combine their arguments' monomials; any other call is one opaque term.
_CALL_TERMS: dict[str, Callable[[list[int]], int]] = {
    "Add": lambda terms: min(sum(terms), TERMS_CAP),
    "Mul": lambda terms: min(math.prod(terms), TERMS_CAP),
    "Rational": lambda terms: min(math.prod(terms), TERMS_CAP),
    "Integer": lambda terms: terms[0] if terms else 1,
    "Identity": lambda terms: terms[0] if terms else 1,
}


def _power_terms(terms: int, exponent: int) -> int:
    """Monomials of a sum of `terms` monomials to the `exponent`: at most terms ** |exponent|."""
    if terms == 1 or exponent == 0:
        return 1
    return (
        TERMS_CAP
        if abs(exponent) * math.log2(terms) >= math.log2(TERMS_CAP)
        else terms ** abs(exponent)
    )


class _Parser:
    """Recursive descent over the tokens; each method returns the canonical text of its part and
    the size of the numbers it can make, refusing any part past `expr_size.MAX_BITS`."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0
        self.atoms = 0
        self.simplifying = 0

    def peek(self) -> Tok:
        return self.toks[self.i]

    def take(self, text: str | None = None) -> Tok:
        tok = self.toks[self.i]
        if text is not None and tok.text != text:
            raise _refuse(self.text, f"expected {text!r}, found {tok.text or 'the end'!r}")
        self.i += 1
        return tok

    def nested(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _refuse(self.text, "nested too deeply")

    def atom_seen(self) -> None:
        self.atoms += 1
        if self.atoms > MAX_ATOMS:
            raise _refuse(self.text, f"more than {MAX_ATOMS} numbers and symbols")

    def simplifying_seen(self) -> None:
        self.simplifying += 1
        if self.simplifying > MAX_SIMPLIFYING:
            raise _refuse(
                self.text, f"more than {MAX_SIMPLIFYING} Max, Min, Mod, floor division or Piecewise"
            )

    def part(
        self, text: str, size: Size, minmax: tuple[str, int] | None = None, terms: int = 1
    ) -> Part:
        """A part, unless the numbers it can make are past the limit."""
        if size.bits > expr_size.MAX_BITS:
            raise _refuse(
                self.text,
                f"{text[:40]!r} can make a number of about {size.bits} bits (with every size "
                f"symbol in the 64-bit range); the limit is {expr_size.MAX_BITS} bits",
            )
        return Part(text, size, minmax, terms)

    def parse(self) -> str:
        out = self.expr()
        if self.peek().kind != "end":
            raise _refuse(self.text, f"unexpected {self.peek().text!r}")
        return out.text

    def expr(self) -> Part:
        self.nested()
        left = self.bitor()
        if self.peek().text in COMPARISONS:
            op = self.take().text
            right = self.bitor()
            if self.peek().text in COMPARISONS:
                raise _refuse(self.text, "chained comparisons are not accepted")
            left = self.part(f"({left.text} {op} {right.text})", expr_size.BOOLEAN)
        self.depth -= 1
        return left

    def _binary(self, ops: tuple[str, ...], operand: Callable[[], Part]) -> Part:
        left = operand()
        while self.peek().kind == "op" and self.peek().text in ops:
            op = self.take().text
            right = operand()
            size = _BINARY_SIZES[op](left.size, right.size)
            text = f"({left.text} {op} {right.text})"
            if op in ("//", "%"):
                self.simplifying_seen()
                self.expandable(op, (left, right))
            left = self.part(text, size, terms=_BINARY_TERMS[op](left, right))
        return left

    def bitor(self) -> Part:
        return self._binary(("|",), self.bitand)

    def bitand(self) -> Part:
        return self._binary(("&",), self.arith)

    def arith(self) -> Part:
        return self._binary(("+", "-"), self.term)

    def term(self) -> Part:
        return self._binary(("*", "/", "//", "%"), self.unary)

    def unary(self) -> Part:
        if self.peek().kind == "op" and self.peek().text in ("-", "+", "~"):
            op = self.take().text
            self.nested()
            inner = self.unary()
            self.depth -= 1
            text = f"({op}{inner.text})"
            return self.part(text, _UNARY_SIZES[op](inner.size), terms=inner.terms)
        return self.power()

    def power(self) -> Part:
        base = self.atom()
        if self.peek().text == "**":
            self.take()
            exponent, value = self.small_int()
            text = f"({base.text} ** {exponent})"
            size = expr_size.power(base.size, value)
            return self.part(text, size, terms=_power_terms(base.terms, value))
        return base

    def small_int(self) -> tuple[str, int]:
        """An exponent or shift: an integer literal of at most MAX_EXPONENT, maybe negated; its
        text and value (negative exactly when the text has a minus sign)."""
        sign = ""
        if self.peek().text == "(":
            self.take()
            inner = self.small_int()
            self.take(")")
            return inner
        if self.peek().text == "-":
            self.take()
            sign = "-"
        if self.peek().text == "Integer":
            self.take()
            self.take("(")
            text, value = self.small_int()
            self.take(")")
            signed = text if text.startswith("-") else f"{sign}{text}"
            return f"Integer({signed})", -abs(value) if "-" in signed else abs(value)
        tok = self.take()
        if tok.kind != "num" or not tok.text.isdigit() or int(tok.text) > MAX_EXPONENT:
            raise _refuse(self.text, f"exponents and shifts must be integers up to {MAX_EXPONENT}")
        return f"{sign}{int(tok.text)}", -int(tok.text) if sign else int(tok.text)

    def number(self, text: str) -> Part:
        self.atom_seen()
        if text.isdigit():
            if len(text) > MAX_INT_DIGITS:
                raise _refuse(self.text, "an integer literal is too long")
            return self.part(str(int(text)), expr_size.of_int(int(text)))
        if DECIMAL.fullmatch(text) is None:
            raise _refuse(self.text, f"{text!r} is not a plain number")
        return self.part(text, expr_size.of_decimal(text))

    def atom(self) -> Part:
        tok = self.take()
        if tok.kind == "num":
            return self.number(tok.text)
        if tok.kind == "op" and tok.text == "(":
            inner = self.expr()
            self.take(")")
            if _wrapped(inner.text):
                return inner
            return Part(f"({inner.text})", inner.size, inner.minmax, inner.terms)
        if tok.kind == "name":
            if self.peek().text == "(":
                return self.call(tok.text)
            self.atom_seen()
            if tok.text in CONSTANTS:
                return Part(tok.text, expr_size.BOOLEAN)
            return Part(check_symbol(tok.text, self.text), expr_size.SYMBOL)
        raise _refuse(self.text, f"unexpected {tok.text or 'end'!r}")

    def call(self, name: str) -> Part:
        if name not in FUNCTIONS:
            raise _refuse(self.text, f"{name!r} is not an accepted function")
        if name in SIMPLIFYING:
            self.simplifying_seen()
        self.take("(")
        self.nested()
        minmax = None
        terms = 1
        if name in ("Symbol", "Dummy", "Float"):
            self.atom_seen()
        if name in ("Symbol", "Dummy"):
            args = [self.symbol_name(), *self.assumptions()]
            size = expr_size.SYMBOL
        elif name == "Float":
            text, size = self.float_text()
            args = [text, *self.keywords(frozenset({"precision"}))]
        elif name in EXPONENT_FUNCTIONS:
            base = self.expr()
            self.take(",")
            exponent, value = self.small_int()
            args = [base.text, exponent]
            if name in ("Pow", "PowByNatural", "FloatPow"):
                terms = _power_terms(base.terms, value)
            if name == "LShift":
                size = expr_size.shift_left(base.size, value)
            elif name == "RShift":
                size = base.size
            else:
                size = expr_size.power(base.size, value)
        else:
            parts = [] if self.peek().text == ")" else [self.expr()]
            while self.peek().text == ",":
                self.take()
                parts.append(self.expr())
            args = [p.text for p in parts]
            if name in ("Max", "Min"):
                minmax = (name, self.flattened(name, parts))
            if name in SIMPLIFYING:
                self.expandable(name, parts)
            if name in _CALL_TERMS:
                terms = _CALL_TERMS[name]([p.terms for p in parts])
            found = expr_size.of_call(name, [p.size for p in parts])
            if found is None:
                raise _refuse(self.text, f"fxtune cannot bound the numbers {name!r} makes")
            size = found
        self.take(")")
        self.depth -= 1
        text = f"{name}({', '.join(args)})"
        return self.part(text, size, minmax, terms)

    def expandable(self, name: str, parts: tuple[Part, ...] | list[Part]) -> None:
        """sympy's Mod, floor division, Max... factor and compare their arguments: refuse
        arguments whose expansion has more than MAX_TERMS monomials."""
        for p in parts:
            if p.terms > MAX_TERMS:
                raise _refuse(
                    self.text,
                    f"an argument of {name} has over {MAX_TERMS} terms expanded: {p.text[:40]!r}",
                )

    def flattened(self, name: str, parts: list[Part]) -> int:
        """The arguments sympy's Max or Min compares: nested calls of the same kind flatten."""
        count = sum(p.minmax[1] if p.minmax and p.minmax[0] == name else 1 for p in parts)
        if count > MAX_MINMAX_ARGS:
            raise _refuse(self.text, f"a {name} of more than {MAX_MINMAX_ARGS} arguments")
        return count

    def symbol_name(self) -> str:
        tok = self.take()
        if tok.kind != "str":
            raise _refuse(self.text, "Symbol takes a quoted name")
        return f"'{check_symbol(tok.text[1:-1], self.text)}'"

    def float_text(self) -> tuple[str, Size]:
        tok = self.take()
        quoted = tok.kind == "str"
        body = tok.text[1:-1] if quoted else tok.text
        digits = body.removeprefix("-") if quoted else body
        if tok.kind not in ("str", "num") or not (
            DECIMAL.fullmatch(digits) or (digits.isdigit() and len(digits) <= MAX_INT_DIGITS)
        ):
            raise _refuse(self.text, "Float takes a plain decimal")
        return (f"'{body}'" if quoted else body), expr_size.of_decimal(digits)

    def keywords(self, allowed: frozenset[str]) -> list[str]:
        out = []
        while self.peek().text == ",":
            self.take()
            key = self.take()
            if key.kind != "name" or key.text not in allowed:
                raise _refuse(self.text, f"keyword {key.text!r} is not accepted here")
            self.take("=")
            value = self.take()
            if value.text in ("True", "False"):
                out.append(f"{key.text}={value.text}")
            elif value.kind == "num" and value.text.isdigit():
                number = self.number(value.text).text
                if key.text == "precision" and int(number) > MAX_PRECISION:
                    raise _refuse(self.text, f"a Float's precision is at most {MAX_PRECISION} bits")
                out.append(f"{key.text}={number}")
            else:
                raise _refuse(self.text, f"keyword {key.text} takes True, False or an integer")
        return out

    def assumptions(self) -> list[str]:
        return self.keywords(ASSUMPTIONS)


def _wrapped(text: str) -> bool:
    """Whether `text` is one parenthesized group, as the printer makes every operation."""
    if not (text.startswith("(") and text.endswith(")")):
        return False
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and i < len(text) - 1:
            return False
    return True


def canonical_expression(text: object) -> str:
    """The canonical text of an expression in fxtune's grammar, or UnsafeArtifactError."""
    if not isinstance(text, str):
        raise UnsafeArtifactError("refused symbolic expression: not a string")
    if len(text) > MAX_LENGTH:
        raise _refuse(text, f"longer than {MAX_LENGTH} characters")
    return _Parser(text).parse()


def check_range_key(text: object) -> str:
    """A range-constraint key (`s0`, `2*s26`) parses in the grammar; it is kept as written,
    since torch only compares it with printed symbols and reads a symbol's number from it."""
    canonical_expression(text)
    return str(text)


# Guards (`guards_code`) are checked, then dropped: fxtune never executes them (the range
# constraints still check sizes). The check parses with `ast` (parsing runs nothing) and accepts
# only size arithmetic over `L['input']...size()[i]`-style accessors, so a crafted guard is
# refused rather than silently ignored.
_GUARD_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_GUARD_FUNCTIONS = frozenset({"Max", "Min", "Eq", "Ne", "FloorDiv", "Mod", "PythonMod"})
_GUARD_OPS = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
    ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Div, ast.Compare, ast.Eq,
    ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Load,
)  # fmt: skip


def _guard_node(node: ast.AST, text: str) -> None:
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, bool, float) or abs(node.value) >= 2**63:
            raise _refuse(text, "guards compare sizes with numbers only", "guard")
        return
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _GUARD_METHODS:
            if node.args or node.keywords:
                raise _refuse(text, "size accessors take no arguments", "guard")
            _guard_accessor(func.value, text)
            return
        if isinstance(func, ast.Name) and func.id in _GUARD_FUNCTIONS and not node.keywords:
            for arg in node.args:
                _guard_node(arg, text)
            return
        raise _refuse(text, "a guard calls something other than a size accessor", "guard")
    if isinstance(node, ast.Subscript):
        _guard_accessor(node, text)
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        right = node.right
        if not (isinstance(right, ast.Constant) and type(right.value) is int):
            raise _refuse(text, "exponents must be integer literals", "guard")
        if not 0 <= right.value <= MAX_EXPONENT:
            raise _refuse(text, f"exponents must be at most {MAX_EXPONENT}", "guard")
        _guard_node(node.left, text)
        return
    if not isinstance(node, _GUARD_OPS):
        raise _refuse(text, f"{type(node).__name__} is not accepted in a guard", "guard")
    for child in ast.iter_child_nodes(node):
        _guard_node(child, text)


def _guard_accessor(node: ast.AST, text: str) -> None:
    """`L['x']`, `L['x']['k'][0]`, `L['x'].size()[0]`: an input, maybe indexed, maybe sized."""
    while True:
        if isinstance(node, ast.Name) and node.id == "L":
            return
        if isinstance(node, ast.Subscript):
            key = node.slice
            if not isinstance(key, ast.Constant) or not (
                (isinstance(key.value, str) and _IDENT_KEY.fullmatch(key.value))
                or (type(key.value) is int and 0 <= key.value < 2**31)
            ):
                raise _refuse(
                    text, "a guard indexes with something other than a name or number", "guard"
                )
            node = node.value
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr not in _GUARD_METHODS or node.args or node.keywords:
                raise _refuse(text, "a guard calls something other than a size accessor", "guard")
            node = node.func.value
            continue
        raise _refuse(text, "a guard reads something other than the inputs' sizes", "guard")


_IDENT_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def check_guard(text: object) -> None:
    """Refuse a guard outside the grammar above; a valid one is still never executed."""
    if not isinstance(text, str):
        raise UnsafeArtifactError("refused guard: not a string")
    if len(text) > MAX_LENGTH or any(c in text for c in "\n\r#;\\\0"):
        raise _refuse(text, "guards are one short line of size arithmetic", "guard")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise _refuse(text, "not a Python expression", "guard") from None
    _guard_node(tree, text)
