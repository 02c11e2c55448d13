import pytest

from tuner.profiling.categories import CATEGORIES, category_of, is_compiled_kernel, is_operator


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("aten::addmm", "matmul_conv"),
        ("aten::mm", "matmul_conv"),
        ("aten::linear", "matmul_conv"),
        ("aten::mkldnn_convolution", "matmul_conv"),
        ("aten::_scaled_dot_product_flash_attention", "matmul_conv"),
        ("ampere_sgemm_128x64_tn", "matmul_conv"),
        ("aten::native_layer_norm", "norm"),
        ("aten::_native_batch_norm_legit_no_training", "norm"),
        ("aten::_softmax", "norm"),
        ("aten::tanh", "pointwise"),
        ("aten::add_", "pointwise"),
        ("aten::clamp_min", "pointwise"),
        ("void at::native::vectorized_elementwise_kernel<4, tanh>", "pointwise"),
        ("aten::embedding_bag", "embedding"),
        ("aten::_embedding_bag_forward_only", "embedding"),
        ("fbgemm::split_embedding_codegen_lookup_sum_function", "embedding"),
        ("aten::cat", "data_movement"),
        ("aten::split_with_sizes", "data_movement"),
        ("aten::_to_copy", "data_movement"),
        ("aten::copy_", "data_movement"),
        ("aten::t", "data_movement"),
        ("Memcpy DtoD (Device -> Device)", "data_movement"),
        ("c10d::allreduce_", "collective"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"),
        ("_c10d_functional::all_to_all_single", "collective"),
        ("graph_0_cpp_fused_add_native_layer_norm_tanh_0", "norm"),
        ("graph_0_cpp_fused_sum_0", "pointwise"),
        ("triton_poi_fused_cat_1", "data_movement"),
        ("aten::empty", "other"),
        ("aten::normal_", "other"),
        ("prims::convert_element_type", "other"),
        ("aten::resolve_conj", "other"),
    ],
)
def test_category_of(name: str, category: str) -> None:
    assert category_of(name) == category


def test_categories_end_with_other() -> None:
    assert CATEGORIES[-1] == "other"
    assert {"matmul_conv", "norm", "pointwise", "embedding", "data_movement", "collective"} <= set(
        CATEGORIES
    )


def test_compiled_kernels_and_operators() -> None:
    assert is_compiled_kernel("graph_0_cpp_fused_tanh_0")
    assert is_compiled_kernel("triton_red_fused_sum_2")
    assert not is_compiled_kernel("aten::tanh")
    assert is_operator("aten::mm") and is_operator("c10d::allreduce_")
    assert not is_operator("## Call CompiledFxGraph abc ##")
    assert not is_operator("TorchDynamo Cache Lookup")
