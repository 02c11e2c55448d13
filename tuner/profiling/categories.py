"""Which kind of work an op or kernel name stands for, as HTA's breakdowns group them.

One registry of regular expressions per category, tried in order; the first category with a match
wins, so specific kinds (collectives, GEMM/conv, norms) come before generic ones (data movement,
pointwise). Names are ATen ops (`aten::addmm`), inductor kernels (`graph_0_cpp_fused_add_tanh_0`,
`triton_poi_fused_cat_1`) or CUDA kernels (`ampere_sgemm_128x64_tn`), matched in lower case.
"""

from __future__ import annotations

import re

OTHER = "other"


def words(*names: str) -> str:
    """Names as whole tokens: `add` matches `aten::add_` and `cpp_fused_add_tanh`, not `addmm`."""
    return rf"(?<![a-z0-9])(?:{'|'.join(names)})(?![a-z0-9])"


CATEGORY_PATTERNS: dict[str, tuple[str, ...]] = {
    "collective": (
        r"nccl",
        r"c10d",
        r"gloo",
        words("all_?reduce", "all_?gather\\w*", "reduce_?scatter\\w*", "all_?to_?all\\w*"),
    ),
    "matmul_conv": (
        r"(?<!fb)gemm",
        r"gemv",
        r"cutlass",
        r"cublas",
        r"conv(?!ert)",
        r"matmul",
        r"einsum",
        r"attention",
        r"flash_",
        r"fmha",
        words("mm", "addmm", "bmm", "baddbmm", "addbmm", "_int_mm", "_scaled_mm"),
        words("mv", "addmv", "dot", "vdot", "linear", "bilinear", "_addmm_activation"),
    ),
    "norm": (r"norm(?!al)", r"softmax", r"welford"),
    "embedding": (r"embedding", r"fbgemm", r"sparse_lengths"),
    "data_movement": (
        r"memcpy",
        r"memset",
        r"catarray",
        words("cat", "concat", "stack", "split", "chunk", "unbind", "narrow", "slice", "select"),
        words("copy", "clone", "contiguous", "permute", "transpose", "t", "view", "reshape"),
        words("expand", "squeeze", "unsqueeze", "flatten", "as_strided", "alias", "detach"),
        words("index", "index_select", "index_put", "gather", "scatter", "scatter_add", "take"),
        words("to", "pad", "constant_pad_nd", "repeat", "tile", "roll", "flip", "fill", "zero"),
    ),
    "pointwise": (
        r"elementwise",
        words("add", "sub", "rsub", "mul", "div", "true_divide", "neg", "abs", "reciprocal"),
        words("exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "pow", "square"),
        words("sign", "floor", "ceil", "round", "trunc", "fmod", "remainder", "lerp"),
        words("clamp", "clamp_min", "clamp_max", "clip", "where", "maximum", "minimum"),
        words("tanh", "sigmoid", "relu", "relu6", "gelu", "silu", "mish", "elu", "selu", "celu"),
        words("leaky_relu", "hardtanh", "hardswish", "hardsigmoid", "softplus", "prelu", "glu"),
        words("threshold", "erf", "erfc", "sin", "cos", "tan", "logit", "dropout", "masked_fill"),
        words("addcmul", "addcdiv", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "nan_to_num"),
        words("logical_\\w+", "bitwise_\\w+"),
        # inductor's fused kernels whose name names nothing more specific
        r"cpp_fused",
        r"triton_",
    ),
}

CATEGORIES: tuple[str, ...] = (*CATEGORY_PATTERNS, OTHER)


# AOTInductor's calls of ATen kernels outside its generated code (GEMMs, embedding bags), as
# named by the profiler ranges of an instrumented package: `aoti_torch_cpu_addmm_out`.
AOTI_EXTERN = re.compile(r"^aoti_torch_[a-z]+_", re.I)


def category_of(op_name: str) -> str:
    """The first registry category whose patterns match `op_name`, else "other"."""
    name = AOTI_EXTERN.sub("", op_name.lower())
    for category, patterns in CATEGORY_PATTERNS.items():
        if any(re.search(p, name) for p in patterns):
            return category
    return OTHER


COMPILED_KERNEL = re.compile(r"(?:^|_)(?:cpp_fused_|triton_(?:poi|red|per|tem|for)_)", re.I)
COMPILED_REGION = re.compile(r"CompiledFxGraph|Torch-Compiled Region")
OPERATOR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::")


def is_compiled_kernel(name: str) -> bool:
    """Inductor's kernels: generated ones and AOTInductor's extern calls, named ranges in the
    trace of an instrumented build, not ATen ops (the extern calls bypass the dispatcher)."""
    return COMPILED_KERNEL.search(name) is not None or AOTI_EXTERN.match(name) is not None


def is_operator(name: str) -> bool:
    """A dispatcher op (`aten::mm`, `c10d::allreduce_`, `fbgemm::...`), as opposed to a range."""
    return OPERATOR.match(name) is not None
