"""What one call of an operator costs, from its meta arguments and outputs, or a refusal.

torch's `FlopCounterMode` counts matmuls, convolutions and attention; every other op counted 0,
so `linalg_matrix_exp` of a 6144 x 6144 matrix, a chain of sorts of 2^27 elements or a
`while_loop` whose trip count is data passed the resource bounds as free. Costs here fail
closed: every ATen op that actually runs (a composite op such as `linear` is priced by the ops it
decomposes into, run on `meta` tensors under `Pricing`) is priced by, in order,

- its rule in `COST_RULES`, by overload packet (`aten.sort`);
- torch's own FLOP formula (`torch.utils.flop_counter.flop_registry`), at least its traffic;
- its tags: `pointwise` and `reduction` ops cost their traffic;
- a view (every result aliases an input, nothing written) or an in-place view (`squeeze_`,
  which changes sizes only) costs nothing;

and an op none of these price is refused, naming the node and the op. Costs are in FLOP-
equivalents: the matmul FLOPs that take as long on a CPU. Weights were measured on one thread
of a 2-core machine, torch 2.13, against a 768^3 fp32 matmul, and rounded up: an element read or
written by a memory-bound op costs 64 (an add measured 67), one moved by a data-dependent address
(gather, scatter, embedding) 256, a random draw 256, and a sort 512 per n log2 n (measured 510).
Sizes that depend on data (`nonzero`, `unique`) are the upper bounds export recorded.

Higher-order ops run graphs: `HOP_RULES` says how many times each body runs (`scan` and `map`
once per leading-dim slice, `cond` the dearer branch, wrappers once); `while_loop`, whose trip
count is data, is refused.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from tuner.contract.errors import UnsafeArtifactError
from tuner.host.torch_compat import python_dispatch

ELEMENT = 64.0  # FLOP-equivalents per element a memory-bound op reads or writes
SCATTERED = 256.0  # per element read or written at a data-dependent address
RANDOM = 256.0  # per random number drawn
SORT = 512.0  # per element per log2 of the elements sorted
MATRIX = 8.0  # per n^3 of an LU-like factorization (inverse, solve, det, QR, Cholesky)
SPECTRAL = 128.0  # per n^3 of an eigen- or singular value decomposition
INTERPOLATION_TAPS = 16  # inputs read per output by upsampling and grid sampling (bicubic)
MATRIX_EXP_PRODUCTS = 8  # matmuls of the degree-18 Pade approximant, before the squarings


class UnpricedOpError(UnsafeArtifactError):
    """An op whose cost fxtune cannot bound: refused rather than counted as free."""


@dataclass(frozen=True)
class Call:
    """One call: the op, its arguments (meta tensors, sizes as ints) and its outputs."""

    op: Any
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    out: Any

    def inputs(self) -> list[torch.Tensor]:
        return list(_tensors((self.args, dict(self.kwargs))))

    def outputs(self) -> list[torch.Tensor]:
        return list(_tensors(self.out))

    def traffic(self) -> int:
        return _numel(self.inputs()) + _numel(self.outputs())


CostRule = Callable[[Call], float]


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _numel(tensors: Sequence[torch.Tensor]) -> int:
    return sum(math.prod(t.shape) for t in tensors)


def _log2(n: int) -> float:
    return math.log2(max(n, 2))


def free(call: Call) -> float:
    return 0.0


def per_element(weight: float) -> CostRule:
    """Elements read and written, each at `weight`."""
    return lambda call: weight * call.traffic()


def per_output(weight: float) -> CostRule:
    """Factories and random draws: the elements made."""
    return lambda call: weight * _numel(call.outputs())


def gathered(call: Call) -> float:
    """gather, index, embedding: each output element read through a computed address (the
    source is not read whole), and the indices."""
    indices = sum(math.prod(t.shape) for t in call.inputs() if not t.is_floating_point())
    return SCATTERED * (indices + _numel(call.outputs()))


def scattered(call: Call) -> float:
    """scatter, index_put, index_add: the source copied, then elements written through computed
    addresses."""
    return SCATTERED * call.traffic()


def looked_up(call: Call) -> float:
    """Embedding bags: each index reads a whole row of the table (the first input)."""
    inputs = call.inputs()
    if not inputs or inputs[0].dim() < 1:
        return gathered(call)
    indices = sum(math.prod(t.shape) for t in inputs[1:] if not t.is_floating_point())
    return SCATTERED * (indices * math.prod(inputs[0].shape[1:]) + _numel(call.outputs()))


def sorted_cost(call: Call) -> float:
    """Sorts, top-k, order statistics, unique, searches: n log2 n of the largest input."""
    largest = max((math.prod(t.shape) for t in call.inputs()), default=0)
    return SORT * largest * _log2(largest) + ELEMENT * call.traffic()


def fft_cost(call: Call) -> float:
    return ELEMENT * call.traffic() * _log2(max((t.numel() for t in call.inputs()), default=0))


def _matrices(call: Call) -> Iterator[tuple[int, int, int]]:
    """(batch, rows, columns) of every matrix argument."""
    for t in call.inputs():
        if t.dim() >= 2:
            yield math.prod(t.shape[:-2]), t.shape[-2], t.shape[-1]


def cubic(weight: float) -> CostRule:
    """Factorizations and solves: batch x m x n x min(m, n) per matrix argument."""

    def cost(call: Call) -> float:
        work = sum(b * m * n * min(m, n) for b, m, n in _matrices(call))
        return weight * work + ELEMENT * call.traffic()

    return cost


def matrix_exp_cost(call: Call) -> float:
    """Scaling and squaring: the Pade products, then one squaring per binary order of magnitude
    of the norm, which the dtype's largest exponent bounds (128 for float32)."""
    (a,) = call.inputs()[:1]
    squarings = math.ceil(math.log2(torch.finfo(a.dtype).max))
    work = sum(2 * b * n**3 for b, n, _ in _matrices(call))
    return (MATRIX_EXP_PRODUCTS + squarings) * work + ELEMENT * call.traffic()


def pairwise_cost(call: Call) -> float:
    """cdist, pdist: every output distance reads a pair of rows."""
    inputs = call.inputs()
    row = inputs[0].shape[-1] if inputs and inputs[0].dim() else 1
    return ELEMENT * (2 * row * _numel(call.outputs()) + call.traffic())


def batched_matmul(call: Call) -> float:
    """addbmm, _scaled_mm_v2: 2 x batch x m x k x n over the first two matrix arguments."""
    matrices = [t for t in call.inputs() if t.dim() >= 2][-2:]
    if len(matrices) < 2:
        return ELEMENT * call.traffic()
    a, b = matrices
    flops = 2 * math.prod(a.shape[:-2]) * a.shape[-2] * a.shape[-1] * b.shape[-1]
    return max(float(flops), ELEMENT * call.traffic())


def attention(call: Call) -> float:
    """Fused attention kernels: q @ k^T and its product with v, 4 x batch x heads x Lq x Lk x d."""
    qkv = [t for t in call.inputs() if t.dim() >= 2][:3]
    if len(qkv) < 3:
        return ELEMENT * call.traffic()
    q, k, v = qkv
    flops = 2 * math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    return max(float(flops), ELEMENT * call.traffic())


def trilinear(call: Call) -> float:
    """`_trilinear` (bilinear layers): a product over the three inputs' broadcast shape, each
    input first unsqueezed at its `expand` dimensions."""
    shapes = []
    for t, expand in zip(call.args[:3], call.args[3:6], strict=False):
        shape = list(t.shape)
        for dim in sorted(expand):
            shape.insert(dim, 1)
        shapes.append(shape)
    space = math.prod(torch.broadcast_shapes(*shapes)) if shapes else 0
    return 2.0 * space + ELEMENT * call.traffic()


def pooled(call: Call) -> float:
    """Pooling: each output reads its window (`kernel_size`, the second argument)."""
    window = call.args[1] if len(call.args) > 1 else call.kwargs.get("kernel_size", 1)
    size = math.prod(window) if isinstance(window, list | tuple) else int(window or 1)
    return ELEMENT * (max(size, 1) * _numel(call.outputs()) + call.traffic())


def interpolated(call: Call) -> float:
    return ELEMENT * (INTERPOLATION_TAPS * _numel(call.outputs()) + call.traffic())


def _names(*names: str, namespace: str = "aten") -> list[str]:
    return [f"{namespace}.{n}" for n in names]


# Ops that only read sizes, check or convert a scalar, or view without an alias annotation.
_FREE = _names(
    "_assert_async", "_assert_scalar", "_assert_tensor_metadata", "_functional_assert_async",
    "_functional_assert_scalar", "_functional_sym_constrain_range",
    "_functional_sym_constrain_range_for_size", "sym_constrain_range",
    "sym_constrain_range_for_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "size", "stride", "dense_dim", "sparse_dim", "is_coalesced", "is_non_overlapping_and_dense",
    "is_same_size", "is_strides_like_format", "_make_dep_token", "_unsafe_view",
    "_local_scalar_dense", "item", "_linalg_check_errors", "lift_fresh", "detach", "alias",
    "narrow", "tensor_split", "unsafe_split", "unsafe_split_with_sizes", "is_pinned",
    "_has_same_storage_numel", "is_set_to",
)  # fmt: skip
# Copies, concatenation, padding, normalization, softmax, scans, losses: linear in the elements.
_LINEAR = _names(
    "_to_copy", "copy", "clone", "cat", "_chunk_cat", "stack", "hstack", "vstack",
    "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "replication_pad1d", "replication_pad2d", "replication_pad3d", "repeat", "flip", "roll",
    "tril", "triu", "diag_embed", "block_diag", "slice_scatter", "select_scatter",
    "diagonal_scatter", "as_strided_scatter", "_reshape_copy", "view_copy", "expand_copy",
    "permute_copy", "alias_copy", "as_strided_copy", "diagonal_copy", "narrow_copy",
    "squeeze_copy", "t_copy", "transpose_copy", "unbind_copy", "unfold_copy", "unsqueeze_copy",
    "split_copy", "split_with_sizes_copy", "lift_fresh_copy", "_to_dense", "native_batch_norm",
    "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "_batch_norm_with_update",
    "_batch_norm_with_update_functional", "_batch_norm_no_update", "native_layer_norm",
    "native_group_norm", "_fused_rms_norm", "_softmax", "_log_softmax", "_safe_softmax",
    "cumsum", "cumprod", "logcumsumexp", "cummax", "cummin", "_cummax_helper",
    "_cummin_helper", "_add_relu", "_prelu_kernel", "glu", "hardswish", "floor_divide",
    "_weight_norm_interface", "renorm", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle",
    "complex", "polar", "dist", "dot", "vdot", "mv", "addmv", "addr", "trace", "linalg_cross",
    "equal", "col2im", "im2col", "affine_grid_generator", "fill", "zero", "lu_unpack",
    "mse_loss", "nll_loss_forward", "nll_loss2d_forward", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "huber_loss", "smooth_l1_loss", "soft_margin_loss",
    "multilabel_margin_loss_forward", "histc", "bincount", "segment_reduce", "max_unpool2d",
    "max_unpool3d", "nonzero", "nonzero_static", "masked_select", "repeat_interleave",
    "quantize_per_tensor", "masked_fill", "rsub", "rot90", "allclose", "hash_tensor",
    "multi_margin_loss", "_ctc_loss", "one_hot", "_masked_softmax", "_logcumsumexp", "_aminmax",
    "batch_norm_stats", "batch_norm_elemt", "batch_norm_gather_stats",
    "batch_norm_gather_stats_with_counts", "batch_norm_update_stats", "_transform_bias_rescale_qkv",
    "select_copy", "slice_copy", "detach_copy", "_conj_copy", "_neg_view_copy",
    "view_as_real_copy", "view_as_complex_copy", "_reshape_alias_copy", "_stack", "_copy_from",
    "_copy_from_and_resize", "_lazy_clone", "_is_all_true", "_is_any_true", "lift",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "_masked_scale", "native_norm",
    "native_layer_norm_backward",
    "native_batch_norm_backward",
    "batch_norm_backward", "native_group_norm_backward", "_softmax_backward_data",
    "_log_softmax_backward_data", "mse_loss_backward", "nll_loss_backward",
    "binary_cross_entropy_backward", "glu_backward", "hardswish_backward",
    "hardsigmoid_backward", "hardtanh_backward", "elu_backward", "leaky_relu_backward",
    "softplus_backward", "log_sigmoid_forward", "log_sigmoid_backward", "select_backward",
    "slice_backward", "diagonal_backward", "unfold_backward", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward",
    "max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
)  # fmt: skip
_GATHERED = _names(
    "gather", "index_select", "index", "_unsafe_index", "_unsafe_masked_index", "take",
    "embedding",
)  # fmt: skip
_SCATTERED = _names(
    "scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_fill",
    "index_put", "_unsafe_index_put", "_unsafe_masked_index_put_accumulate", "_index_put_impl",
    "index_reduce", "masked_scatter", "put", "embedding_dense_backward", "embedding_renorm",
)  # fmt: skip
_LOOKED_UP = _names(
    "_embedding_bag", "_embedding_bag_forward_only", "embedding_bag", "_embedding_bag_backward"
)
_SORTED = _names(
    "sort", "topk", "kthvalue", "median", "nanmedian", "mode", "_unique", "_unique2",
    "unique_dim", "unique_consecutive", "isin", "searchsorted", "bucketize", "histogram",
    "_histogramdd_bin_edges", "_histogramdd_from_bin_tensors", "unique_dim_consecutive",
)  # fmt: skip
_FACTORIES = _names(
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "full", "full_like", "new_full", "ones", "ones_like", "new_ones", "zeros", "zeros_like",
    "new_zeros", "arange", "linspace", "logspace", "eye", "scalar_tensor", "tril_indices",
    "triu_indices", "hann_window", "hamming_window", "blackman_window", "bartlett_window",
    "kaiser_window", "range", "fft_fftfreq", "fft_rfftfreq", "resize", "resize_as",
    "_resize_output", "_efficientzerotensor", "_new_zeros_with_same_feature_meta",
)  # fmt: skip
_RANDOM = _names(
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "normal",
    "uniform", "bernoulli", "exponential", "cauchy", "geometric", "log_normal", "poisson",
    "_standard_gamma", "native_dropout", "_fused_dropout", "rrelu_with_noise",
    "rrelu_with_noise_functional", "random", "binomial", "normal_functional", "_sample_dirichlet",
)  # fmt: skip
_MATRIX = _names(
    "linalg_inv_ex", "_linalg_solve_ex", "linalg_cholesky_ex", "cholesky", "cholesky_solve",
    "_cholesky_solve_helper", "cholesky_inverse", "linalg_lu", "linalg_lu_factor_ex",
    "linalg_lu_solve", "_linalg_det", "_linalg_slogdet", "linalg_qr", "geqrf", "ormqr",
    "linalg_householder_product", "triangular_solve", "linalg_solve_triangular", "linalg_lstsq",
    "linalg_ldl_factor_ex", "linalg_ldl_solve",
)  # fmt: skip
_SPECTRAL = _names(
    "_linalg_eigh", "linalg_eig", "_linalg_eigvals", "linalg_eigvals", "_linalg_svd", "linalg_pinv"
)
_MATMULS = _names(
    "addbmm", "_scaled_mm_v2", "_int_mm", "_addmm_activation", "_grouped_mm", "_mixed_dtypes_linear"
)
# Prims without an ATen op of their name (the rest are priced as that op).
_PRIMS: dict[str, CostRule] = {
    **dict.fromkeys(_names("_make_token", "_sink_tokens", "maximum_value", "minimum_value",
                           namespace="prims"), free),
    **dict.fromkeys(_names("reshape", "collapse", "rev", "as_strided", "copy_strided", "copy_to",
                           "device_put", "erf_inv", "erfcx", "ndtri", "cbrt", "bessel_i0",
                           "bessel_i0e", "bessel_i1", "bessel_i1e", "bessel_j0", "bessel_j1",
                           "spherical_bessel_j0", "zeta", "shift_left", "shift_right_arithmetic",
                           "xor_sum", namespace="prims"), per_element(ELEMENT)),
    **dict.fromkeys(_names("fft_r2c", "fft_c2r", "fft_c2c", namespace="prims"), fft_cost),
    "prims.iota": per_output(ELEMENT),
    "prims.svd": cubic(SPECTRAL),
}  # fmt: skip
_ATTENTION = _names(
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_fused_attention_overrideable",
    "_scaled_dot_product_attention_math_for_mps",
)
_POOLS = _names(
    "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool2d", "avg_pool3d",
    "adaptive_max_pool2d", "adaptive_max_pool3d", "fractional_max_pool2d",
    "fractional_max_pool3d", "avg_pool2d_backward", "avg_pool3d_backward",
)  # fmt: skip
_INTERPOLATIONS = _names(
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d",
    "upsample_bilinear2d", "upsample_bicubic2d", "upsample_trilinear3d",
    "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa", "grid_sampler_2d", "grid_sampler_3d",
    "upsample_nearest2d_backward", "upsample_bilinear2d_backward", "grid_sampler_2d_backward",
)  # fmt: skip
_COLLECTIVES = _names(
    "all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
    "all_to_all_single", "broadcast", "wait_tensor",
    namespace="_c10d_functional",
)  # fmt: skip

# Overload packet -> cost of one call. An op not here is priced by torch's FLOP formula, its
# tags or as a view (`cost_rule`), or refused.
COST_RULES: dict[str, CostRule] = {
    **dict.fromkeys(_FREE, free),
    **dict.fromkeys(_LINEAR, per_element(ELEMENT)),
    **dict.fromkeys(_GATHERED, gathered),
    **dict.fromkeys(_SCATTERED, scattered),
    **dict.fromkeys(_LOOKED_UP, looked_up),
    **dict.fromkeys(_SORTED, sorted_cost),
    **dict.fromkeys(_FACTORIES, per_output(ELEMENT)),
    **dict.fromkeys(_RANDOM, per_output(RANDOM)),
    **dict.fromkeys(_MATRIX, cubic(MATRIX)),
    **dict.fromkeys(_SPECTRAL, cubic(SPECTRAL)),
    **dict.fromkeys(_POOLS, pooled),
    **dict.fromkeys(_INTERPOLATIONS, interpolated),
    **dict.fromkeys(_COLLECTIVES, per_element(ELEMENT)),
    **dict.fromkeys(_names("_fft_r2c", "_fft_c2r", "_fft_c2c"), fft_cost),
    **dict.fromkeys(_names("_cdist_forward", "_euclidean_dist", "_pdist_forward"), pairwise_cost),
    **dict.fromkeys(_MATMULS, batched_matmul),
    **dict.fromkeys(_ATTENTION, attention),
    "aten._trilinear": trilinear,
    **_PRIMS,
    "aten.linalg_matrix_exp": matrix_exp_cost,
    "aten.multinomial": per_element(RANDOM),
}


def packet_name(op: Any) -> str:
    """`aten.sort` for `aten.sort.default` (the overload's packet, as the registries key it)."""
    return str(getattr(op, "overloadpacket", op))


def _functional_name(name: str) -> str:
    """`aten.add` for the in-place `aten.add_`."""
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _is_view(op: Any) -> bool:
    returns = op._schema.returns
    return bool(returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in returns
    )


def _traffic_priced(op: Any) -> bool:
    return torch.Tag.pointwise in op.tags or torch.Tag.reduction in op.tags


def _flop_rule(formula: Callable[..., float]) -> CostRule:
    def cost(call: Call) -> float:
        flops = formula(*call.args, **call.kwargs, out_val=call.out)
        return max(float(flops), ELEMENT * call.traffic())

    return cost


def cost_rule(op: Any) -> CostRule | None:
    """The rule that prices one call of the OpOverload `op`, or None (refused). An in-place op
    (`addmm_`) is priced as its functional form (`addmm`), a prim (`prims.sin`) as the ATen op
    of its name."""
    name = packet_name(op)
    for candidate in dict.fromkeys((name, _functional_name(name), _aten_name(name))):
        if candidate in COST_RULES:
            return COST_RULES[candidate]
        own = candidate == name
        packet = getattr(op, "overloadpacket", None) if own else _packet(candidate)
        if packet in flop_registry:
            return _flop_rule(flop_registry[packet])
        if _traffic_priced(op) if own else _any_traffic_priced(packet):
            return per_element(ELEMENT)
    if _is_view(op) or torch.Tag.inplace_view in op.tags:
        return free
    return None


def _aten_name(name: str) -> str:
    return "aten." + name.removeprefix("prims.") if name.startswith("prims.") else name


def _packet(name: str) -> Any:
    namespace, _, op = name.partition(".")
    return getattr(getattr(torch.ops, namespace, None), op, None)


def _any_traffic_priced(packet: Any) -> bool:
    """Whether any overload of `packet` is tagged pointwise or reduction."""
    if packet is None:
        return False
    overloads = (getattr(packet, o, None) for o in packet.overloads())
    return any(o is not None and _traffic_priced(o) for o in overloads)


@functools.cache
def _pricing_mode() -> type:
    """The dispatch mode class (built on first use: torch's mode base is a private API)."""

    class Pricing(python_dispatch.TorchDispatchMode):
        """Prices each op that reaches dispatch (composites arrive decomposed) as it runs on
        meta tensors; an op without a rule stops the run."""

        def __init__(self) -> None:
            super().__init__()
            self.total = 0.0

        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            kwargs = kwargs or {}
            rule = cost_rule(func)
            if rule is None:
                raise UnpricedOpError(f"refused: fxtune has no cost rule for {func}")
            out = func(*args, **kwargs)
            self.total += rule(Call(func, args, kwargs, out))
            return out

    return Pricing


def node_cost(
    name: str, op: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any
) -> float:
    """The cost of node `name` calling ATen op `op` on meta `args` (its outputs `out` sized from
    the graph): its own rule without running it (data-dependent ops have no meta kernel), else
    the sum over the ops it dispatches when run on meta."""
    rule = COST_RULES.get(packet_name(op)) or COST_RULES.get(_functional_name(packet_name(op)))
    if rule is not None:
        return rule(Call(op, args, kwargs, out))
    mode = _pricing_mode()()
    try:
        with mode:
            op(*args, **kwargs)
    except UnpricedOpError as exc:
        raise UnpricedOpError(
            f"refused: node {name} calls {op}, whose cost fxtune cannot bound "
            f"({str(exc).removeprefix('refused: ')})"
        ) from None
    return mode.total


# ---------------------------------------------------------------------------------------------
# Higher-order ops: how often their bodies run.


@dataclass(frozen=True)
class HopRule:
    """Cost of a higher-order op from its bodies' costs: `trips(args)` runs of the combined
    bodies (`max` for branches, `sum` for bodies that all run); `refusal` refuses outright."""

    trips: Callable[[tuple[Any, ...]], int] = lambda args: 1
    combine: Callable[[Sequence[float]], float] = sum
    refusal: str | None = None

    def check(self, node_name: str) -> None:
        """Refuse before any body is walked."""
        if self.refusal is not None:
            raise UnpricedOpError(f"refused: node {node_name} {self.refusal}")

    def cost(self, node_name: str, args: tuple[Any, ...], bodies: Sequence[float]) -> float:
        self.check(node_name)
        return self.trips(args) * self.combine(bodies or [0.0])


def _leading(position: int, factor: int = 1) -> Callable[[tuple[Any, ...]], int]:
    """The leading size of the first tensor of argument `position` (scan's and map's xs)."""

    def trips(args: tuple[Any, ...]) -> int:
        first = next(_tensors(args[position]), None) if len(args) > position else None
        if first is None or first.dim() == 0:
            raise UnpricedOpError("refused: a scan or map without a tensor to scan over")
        return factor * int(first.shape[0])

    return trips


HOP_RULES: dict[str, HopRule] = {
    "cond": HopRule(combine=max),
    "while_loop": HopRule(
        refusal="is a while_loop: its trip count depends on tensor data, so nothing bounds "
        "its cost (write the loop with a fixed trip count, e.g. torch.scan, or unroll it)"
    ),
    "scan": HopRule(trips=_leading(2)),
    "map_impl": HopRule(trips=_leading(1)),
    "associative_scan": HopRule(trips=_leading(1, factor=2)),
    "invoke_subgraph": HopRule(),
    "wrap_with_set_grad_enabled": HopRule(),
    "wrap_with_autocast": HopRule(),
}


def hop_rule(target: Any) -> HopRule | None:
    """The rule for a higher-order op target (None: not one of torch's accepted ones)."""
    for name, rule in HOP_RULES.items():
        if target is getattr(torch.ops.higher_order, name, None):
            return rule
    return None
