"""fxtune's own grammar for the symbolic-size expressions in a program JSON.

torch's deserializer hands every `expr_str` to `sympy.sympify`, which `eval`s it with Python's
builtins in scope: `(exec(...) or 0)*0+16` runs and still evaluates to 16. So an upload's
expression text never reaches sympy as written. It is tokenized and parsed here against a small
grammar (integers, decimals, size symbols such as `s0` and `u3`, the arithmetic, comparison and
boolean operators, and calls of an allowlisted set of sympy and torch functions, in either the
`str` or the `srepr` form torch writes), then printed back from the parse tree, fully
parenthesized. Only that printed text goes on to torch. Exponents and shifts are limited to small
literals, since sympy evaluates `10**10**9` or `LShift(1, 10**9)` eagerly; length, depth and
symbol numbers are capped.

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
import re
from dataclasses import dataclass

from tuner.contract.errors import UnsafeArtifactError

MAX_LENGTH = 16_384
MAX_DEPTH = 64
MAX_INT_DIGITS = 20
MAX_EXPONENT = 64
MAX_SYMBOL_INDEX = 1_000_000

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


class _Parser:
    """Recursive descent over the tokens; each method returns the canonical text of its part."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0

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

    def parse(self) -> str:
        out = self.expr()
        if self.peek().kind != "end":
            raise _refuse(self.text, f"unexpected {self.peek().text!r}")
        return out

    def expr(self) -> str:
        self.nested()
        left = self.bitor()
        if self.peek().text in COMPARISONS:
            op = self.take().text
            right = self.bitor()
            if self.peek().text in COMPARISONS:
                raise _refuse(self.text, "chained comparisons are not accepted")
            left = f"({left} {op} {right})"
        self.depth -= 1
        return left

    def _binary(self, ops: tuple[str, ...], operand: str) -> str:
        left = getattr(self, operand)()
        while self.peek().kind == "op" and self.peek().text in ops:
            op = self.take().text
            left = f"({left} {op} {getattr(self, operand)()})"
        return left

    def bitor(self) -> str:
        return self._binary(("|",), "bitand")

    def bitand(self) -> str:
        return self._binary(("&",), "arith")

    def arith(self) -> str:
        return self._binary(("+", "-"), "term")

    def term(self) -> str:
        return self._binary(("*", "/", "//", "%"), "unary")

    def unary(self) -> str:
        if self.peek().kind == "op" and self.peek().text in ("-", "+", "~"):
            op = self.take().text
            self.nested()
            inner = self.unary()
            self.depth -= 1
            return f"({op}{inner})"
        return self.power()

    def power(self) -> str:
        base = self.atom()
        if self.peek().text == "**":
            self.take()
            return f"({base} ** {self.small_int()})"
        return base

    def small_int(self) -> str:
        """An exponent or shift: an integer literal of at most MAX_EXPONENT, maybe negated."""
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
            value = self.small_int()
            self.take(")")
            return f"Integer({sign}{value})" if not value.startswith("-") else f"Integer({value})"
        tok = self.take()
        if tok.kind != "num" or not tok.text.isdigit() or int(tok.text) > MAX_EXPONENT:
            raise _refuse(self.text, f"exponents and shifts must be integers up to {MAX_EXPONENT}")
        return f"{sign}{int(tok.text)}"

    def number(self, text: str) -> str:
        if text.isdigit():
            if len(text) > MAX_INT_DIGITS:
                raise _refuse(self.text, "an integer literal is too long")
            return str(int(text))
        if DECIMAL.fullmatch(text) is None:
            raise _refuse(self.text, f"{text!r} is not a plain number")
        return text

    def atom(self) -> str:
        tok = self.take()
        if tok.kind == "num":
            return self.number(tok.text)
        if tok.kind == "op" and tok.text == "(":
            inner = self.expr()
            self.take(")")
            return inner if _wrapped(inner) else f"({inner})"
        if tok.kind == "name":
            if self.peek().text == "(":
                return self.call(tok.text)
            if tok.text in CONSTANTS:
                return tok.text
            return check_symbol(tok.text, self.text)
        raise _refuse(self.text, f"unexpected {tok.text or 'end'!r}")

    def call(self, name: str) -> str:
        if name not in FUNCTIONS:
            raise _refuse(self.text, f"{name!r} is not an accepted function")
        self.take("(")
        self.nested()
        if name in ("Symbol", "Dummy"):
            args = [self.symbol_name(), *self.assumptions()]
        elif name == "Float":
            args = [self.float_text(), *self.keywords(frozenset({"precision"}))]
        elif name in EXPONENT_FUNCTIONS:
            args = [self.expr()]
            self.take(",")
            args.append(self.small_int())
        else:
            args = [] if self.peek().text == ")" else [self.expr()]
            while self.peek().text == ",":
                self.take()
                args.append(self.expr())
        self.take(")")
        self.depth -= 1
        return f"{name}({', '.join(args)})"

    def symbol_name(self) -> str:
        tok = self.take()
        if tok.kind != "str":
            raise _refuse(self.text, "Symbol takes a quoted name")
        return f"'{check_symbol(tok.text[1:-1], self.text)}'"

    def float_text(self) -> str:
        tok = self.take()
        quoted = tok.kind == "str"
        body = tok.text[1:-1] if quoted else tok.text
        digits = body.removeprefix("-") if quoted else body
        if tok.kind not in ("str", "num") or not (
            DECIMAL.fullmatch(digits) or (digits.isdigit() and len(digits) <= MAX_INT_DIGITS)
        ):
            raise _refuse(self.text, "Float takes a plain decimal")
        return f"'{body}'" if quoted else body

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
                out.append(f"{key.text}={self.number(value.text)}")
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
