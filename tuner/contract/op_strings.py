"""The string arguments an uploaded graph may pass to an operator, by operator and argument.

Code generators paste some of them into source: Inductor's C++ kernels write the message of
`aten._assert_async.msg` as `throw std::runtime_error("{msg}")`, the AOTInductor wrapper writes
string arguments of fallback ops as `"{val}"`, neither escaping a quote. So no string of an upload
is passed on as it came: each (operator, argument) has a rule here, and a string argument without
one is refused, as is a string anywhere else in a graph but a constant input.

- `OneOf`: the exact values the operator accepts (reductions, rounding modes, norms, ...);
- `Grammar`: a value parsed against a pattern that holds no quote, backslash, newline or `*`
  (einsum equations, process-group names);
- `Replaced`: free text (assertion messages, error-message names), replaced by a fixed text
  before anything else sees the program; what it said is not needed to compute anything. A text
  holding a double quote, a backslash or a control character is refused besides: torch writes
  none into the messages it generates, and each can end a string literal of generated C++.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tuner.contract.errors import UnsafeArtifactError


@dataclass(frozen=True)
class OneOf:
    values: frozenset[str]

    def __call__(self, value: str) -> str:
        if value not in self.values:
            raise UnsafeArtifactError(f"is not one of {', '.join(sorted(self.values))}")
        return value


@dataclass(frozen=True)
class Grammar:
    pattern: re.Pattern[str]
    what: str

    def __call__(self, value: str) -> str:
        if not self.pattern.fullmatch(value):
            raise UnsafeArtifactError(f"is not {self.what}")
        return value


_LITERAL_BREAKERS = re.compile(r'["\\\x00-\x1f\x7f]')


@dataclass(frozen=True)
class Replaced:
    text: str

    def __call__(self, value: str) -> str:
        if _LITERAL_BREAKERS.search(value):
            raise UnsafeArtifactError(
                "holds a double quote, a backslash or a control character, which could end a "
                "string literal in generated code"
            )
        return self.text


Rule = OneOf | Grammar | Replaced


def one_of(*values: str) -> OneOf:
    return OneOf(frozenset(values))


ASSERT_TEXT = "a runtime check of the uploaded program failed (fxtune replaces its message)"
_EINSUM_TERM = r"[A-Za-z]*(?:\.\.\.)?[A-Za-z]*"
EINSUM = Grammar(
    re.compile(rf" *{_EINSUM_TERM}(?: *, *{_EINSUM_TERM})*(?: *-> *{_EINSUM_TERM})? *"),
    "an einsum equation (letters, commas, '...' and '->')",
)
# Printable in any language's string literal or comment: letters, digits, '_', '.', '-'.
TOKEN = re.compile(r"[A-Za-z0-9_.\-]{0,64}")
GROUP_NAME = Grammar(re.compile(r"[A-Za-z0-9_]{1,64}"), "a process-group name")
REDUCE_OPS = one_of("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum")
PAD_MODES = one_of("constant", "reflect", "replicate", "circular")
FFT_NORMS = one_of("backward", "ortho", "forward")
QUANTILE = one_of("linear", "lower", "higher", "midpoint", "nearest")
UPLO = one_of("L", "U")
SVD_DRIVERS = one_of("gesvd", "gesvdj", "gesvda")
MATRIX_NORMS = one_of("fro", "nuc")
CONV_PADDING = one_of("same", "valid")
INTERPOLATE = one_of(
    "nearest", "linear", "bilinear", "bicubic", "trilinear", "area", "nearest-exact"
)
_FFTS = [
    f"fft_{kind}{dims}"
    for kind in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
    for dims in ("", "2", "n")
]
_REDUCING = [
    "all_reduce",
    "all_reduce_",
    "all_reduce_coalesced",
    "all_reduce_coalesced_",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_out",
    "reduce_scatter_tensor_coalesced",
]
_C10D = [
    *_REDUCING,
    "all_gather_into_tensor",
    "all_gather_into_tensor_out",
    "all_gather_into_tensor_coalesced",
    "all_to_all_single",
    "broadcast",
    "broadcast_",
    "isend",
    "irecv",
]

# (namespace.operator, argument) -> its rule; the overload does not matter.
STRING_ARGUMENTS: dict[tuple[str, str], Rule] = {
    ("aten.gelu", "approximate"): one_of("none", "tanh"),
    ("aten.gelu_", "approximate"): one_of("none", "tanh"),
    ("aten.gelu_backward", "approximate"): one_of("none", "tanh"),
    **{
        (f"aten.{op}", "rounding_mode"): one_of("trunc", "floor")
        for op in ("div", "div_", "divide", "divide_")
    },
    **{(f"aten.{op}", "reduce"): one_of("add", "multiply") for op in ("scatter", "scatter_")},
    **{
        (f"aten.{op}", "reduce"): one_of("sum", "prod", "mean", "amax", "amin")
        for op in ("scatter_reduce", "scatter_reduce_")
    },
    **{
        (f"aten.{op}", "reduce"): one_of("prod", "mean", "amax", "amin")
        for op in ("index_reduce", "index_reduce_")
    },
    ("aten.segment_reduce", "reduce"): one_of("max", "mean", "min", "sum", "prod"),
    ("aten.searchsorted", "side"): one_of("left", "right"),
    ("aten.meshgrid", "indexing"): one_of("ij", "xy"),
    ("aten.pad", "mode"): PAD_MODES,
    ("aten.stft", "pad_mode"): PAD_MODES,
    ("aten.pad_sequence", "padding_side"): one_of("left", "right"),
    ("aten.quantile", "interpolation"): QUANTILE,
    ("aten.nanquantile", "interpolation"): QUANTILE,
    **{(f"aten.{op}", "padding"): CONV_PADDING for op in ("conv1d", "conv2d", "conv3d")},
    ("aten._convolution_mode", "padding"): CONV_PADDING,
    ("aten.__interpolate", "mode"): INTERPOLATE,
    ("aten.__upsample", "mode"): INTERPOLATE,
    **{(f"aten.{op}", "norm"): FFT_NORMS for op in _FFTS},
    **{(f"aten.{op}", "UPLO"): UPLO for op in ("linalg_eigh", "linalg_eigvalsh", "_linalg_eigh")},
    ("aten.linalg_qr", "mode"): one_of("reduced", "complete", "r"),
    **{(f"aten.{op}", "driver"): SVD_DRIVERS for op in ("linalg_svd", "linalg_svdvals")},
    ("aten._linalg_svd", "driver"): SVD_DRIVERS,
    ("aten.linalg_lstsq", "driver"): one_of("gels", "gelsy", "gelsd", "gelss"),
    ("aten.linalg_matrix_norm", "ord"): MATRIX_NORMS,
    ("aten.linalg_norm", "ord"): MATRIX_NORMS,
    ("aten.linalg_cond", "p"): MATRIX_NORMS,
    ("aten.einsum", "equation"): EINSUM,
    **{
        (f"aten.{op}", "assert_msg"): Replaced(ASSERT_TEXT)
        for op in (
            "_assert_async",
            "_assert_scalar",
            "_functional_assert_async",
            "_functional_assert_scalar",
        )
    },
    ("aten._linalg_check_errors", "api_name"): Replaced("linalg"),
    **{(f"_c10d_functional.{op}", "reduce_op"): REDUCE_OPS for op in _REDUCING},
    **{(f"_c10d_functional.{op}", "group_name"): GROUP_NAME for op in _C10D},
}


def operator_key(target: str) -> str:
    """`torch.ops.aten.gelu.default` (as serialized) or `aten.gelu.default` (an OpOverload's
    str) -> `aten.gelu`, what STRING_ARGUMENTS is keyed by."""
    namespace, _, rest = target.removeprefix("torch.ops.").partition(".")
    return f"{namespace}.{rest.split('.', 1)[0]}"


def rule_for(target: str, argument: str) -> Rule | None:
    return STRING_ARGUMENTS.get((operator_key(target), argument))


def checked_argument(target: str, argument: str, value: str) -> str:
    """The value to keep for a string argument of a node calling `target` (replaced free text,
    or `value` itself where it passes its rule); UnsafeArtifactError where it does not."""
    rule = rule_for(target, argument)
    if rule is None:
        raise UnsafeArtifactError(
            f"operator {target} takes no string for {argument!r} that fxtune accepts (every "
            "string argument has an allowlist: it could reach a code generator)"
        )
    try:
        return rule(value)
    except UnsafeArtifactError as exc:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise UnsafeArtifactError(
            f"operator {target}: argument {argument!r} = {shown!r} {exc}"
        ) from None


def constant_token(value: str) -> str:
    """A string the graph takes as a constant input (specialized by export, so unused by any
    operator): a short token, nothing that could leave a literal in generated code."""
    if not TOKEN.fullmatch(value):
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise UnsafeArtifactError(
            f"the constant string input {shown!r} is not accepted (letters, digits, '_', '.' "
            "and '-', at most 64)"
        )
    return value


def canonical_argument(target: Any, argument: str, value: Any) -> Any:
    """`value` as the loader keeps it: what a fingerprint of an in-memory program hashes, so it
    equals the fingerprint of the same program saved and loaded (replaced messages)."""
    if not isinstance(value, str):
        return value
    rule = rule_for(str(target), argument)
    return rule.text if isinstance(rule, Replaced) else value
