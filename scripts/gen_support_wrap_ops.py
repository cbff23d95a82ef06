#!/usr/bin/env python
"""Generate ``probe/hook_module/support_wrap_ops.yaml`` from the installed torch.

Usage: ``python scripts/gen_support_wrap_ops.py > probe/hook_module/support_wrap_ops.yaml``
(or ``-o PATH``).

The public API surface is read from torch itself (``torch.overrides``, ``dir()`` of
``torch.nn.functional`` / ``torch.Tensor``, the dispatcher's aten op table, the
``_VF.X`` calls in torch's own source), then curated with the named lists below:
every excluded name is in a list whose comment says why it must not be dumped.
``torch_npu`` and ``distributed`` cannot be introspected on a CPU build, so they are
curated name lists here. The checked-in YAML may be edited by hand afterwards.
Output is sorted within each section, so reruns on the same torch are byte-identical.
"""
import argparse
import inspect
import os
import re
import sys
import types

import torch
import torch.nn.functional as F
from torch.overrides import get_overridable_functions

SECTIONS = ("functional", "tensor", "torch", "_VF", "distributed", "torch_npu", "aten", "custom")

# ---------------------------------------------------------------------------
# Exclusions. Each list: names that must never be dumped, and why.
# ---------------------------------------------------------------------------

# Python object protocol / serialization / printing: not tensor math, and several are
# called by the interpreter itself (hashing, iteration, repr in the dumper's own logs).
EXCLUDE_PROTOCOL = {
    "__class__", "__class_getitem__", "__delattr__", "__delitem__", "__dir__", "__doc__",
    "__format__", "__getattribute__", "__getattr__", "__get__", "__getstate__", "__hash__",
    "__init__", "__init_subclass__", "__iter__", "__len__", "__new__", "__reduce__",
    "__reduce_ex__", "__repr__", "__reversed__", "__setattr__", "__setstate__",
    "__sizeof__", "__str__", "__subclasshook__", "__weakref__", "__deepcopy__", "__copy__",
    "__contains__",
}
# The interception machinery itself: hooking these would recurse into the interceptor.
EXCLUDE_INTERCEPTION = {
    "__torch_function__", "__torch_dispatch__", "as_subclass", "__array__",
    "__array_wrap__", "__array_priority__", "__cuda_array_interface__", "__dlpack__",
    "__dlpack_device__",
}
# Truthiness / conversion to Python scalars and containers: every `if t:` or logging
# call would be dumped, and the result is not a tensor.
EXCLUDE_TO_PYTHON = {
    "__bool__", "__nonzero__", "__float__", "__int__", "__long__", "__index__",
    "__complex__", "item", "tolist", "numpy",
}
# Metadata queries (shape, strides, dtype/device/layout predicates): called constantly,
# read no tensor data.
EXCLUDE_METADATA = {
    "size", "dim", "ndimension", "nelement", "numel", "stride", "storage_offset",
    "element_size", "data_ptr", "const_data_ptr", "mutable_data_ptr", "storage_type",
    "get_device", "dim_order", "has_names", "is_contiguous",
    "is_complex", "is_conj", "is_floating_point", "is_inference", "is_neg", "is_nonzero",
    "is_pinned", "is_same_size", "is_set_to", "is_shared", "is_signed", "is_coalesced",
    "is_distributed", "qscheme", "q_scale", "q_zero_point", "q_per_channel_axis",
    "q_per_channel_scales", "q_per_channel_zero_points", "dense_dim", "sparse_dim",
    "result_type", "can_cast", "promote_types", "type", "nbytes", "itemsize",
    "_nnz", "names", "is_nested", "is_leaf",
}
# Storage, memory and device placement: bookkeeping on buffers, no value changes.
EXCLUDE_STORAGE = {
    "storage", "untyped_storage", "_typed_storage", "share_memory_", "pin_memory",
    "record_stream", "module_load", "set_", "cpu", "cuda", "xpu", "ipu", "mps", "mtia",
    "hpu", "npu", "to_mkldnn", "new", "new_empty", "new_empty_strided", "empty_like",
    "resize_as_sparse_", "sparse_resize_", "sparse_resize_and_clear_",
}
# Removed in torch 2.x: the attribute is a stub that only raises "removed, use linalg.X".
EXCLUDE_REMOVED = {"eig", "symeig", "lstsq", "solve", "matrix_rank", "reinforce"}
# Autograd bookkeeping: hooks, graph edges and grad flags, not forward computations.
EXCLUDE_AUTOGRAD = {
    "backward", "register_hook", "register_post_accumulate_grad_hook", "requires_grad_",
    "retain_grad", "detach", "detach_", "grad", "grad_fn", "requires_grad", "retains_grad",
}
# Named-tensor dimension renames: metadata only.
EXCLUDE_NAMED = {"rename", "rename_", "refine_names"}
# Grad-mode / autocast / compile / jit / functorch / export utilities (torch namespace).
EXCLUDE_UTILITIES = {
    "autocast", "compile", "cond", "vmap", "export", "jit", "no_grad", "enable_grad",
    "set_grad_enabled", "inference_mode", "is_grad_enabled", "is_inference_mode_enabled",
    "is_tensor", "is_storage", "typename", "get_default_dtype", "set_default_dtype",
    "get_default_device", "set_default_device", "use_deterministic_algorithms",
    "save", "load", "set_printoptions", "wait", "fork",
}
# Random-number state: seeds and generator state, not tensor math.
EXCLUDE_RNG = {"manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state"}
# Symbolic-shape helpers used by torch.compile tracing, never real tensor math.
SYM_PREFIX = "sym_"
# nn.functional module-level helpers and re-exported typing names that are not ops.
EXCLUDE_FUNCTIONAL_HELPERS = {
    "assert_int_or_pair", "boolean_dispatch", "handle_torch_function", "has_torch_function",
    "has_torch_function_unary", "has_torch_function_variadic", "grad",
}

EXCLUDE = (EXCLUDE_PROTOCOL | EXCLUDE_INTERCEPTION | EXCLUDE_TO_PYTHON | EXCLUDE_METADATA
           | EXCLUDE_STORAGE | EXCLUDE_AUTOGRAD | EXCLUDE_NAMED | EXCLUDE_UTILITIES
           | EXCLUDE_RNG | EXCLUDE_FUNCTIONAL_HELPERS | EXCLUDE_REMOVED)

# ---------------------------------------------------------------------------
# Additions that introspection misses.
# ---------------------------------------------------------------------------

# torch.overrides lists factory functions as "ignored" (they take no tensor), but a
# function mode still sees them and their outputs feed the model.
TORCH_FACTORIES = [
    "arange", "range", "linspace", "logspace", "eye", "full", "ones", "zeros", "rand",
    "randn", "randint", "randperm", "normal", "scalar_tensor", "tril_indices",
    "triu_indices", "sparse_coo_tensor", "bartlett_window", "blackman_window",
    "hamming_window", "hann_window", "kaiser_window", "vander",
]
# Private torch ops that training code calls directly (fused optimizers,
# clip_grad_norm_, activation fusions); dumped despite the single-underscore rule. The
# ``_foreach_*`` ops are what torch.optim's foreach implementations call (the default on
# CUDA): without them a foreach optimizer step is invisible at L1.
TORCH_PRIVATE_COMPUTE = [
    "_adaptive_avg_pool2d", "_add_relu", "_add_relu_", "_aminmax", "_batch_norm_impl_index",
    "_convolution", "_foreach_norm", "_fused_adam_", "_fused_adamw_", "_fused_sgd_",
    "_softmax_backward_data",
] + sorted(n for n in dir(torch) if n.startswith("_foreach_"))
# Sub-namespaces of torch listed under ``torch`` as dotted names (``linalg.norm``).
TORCH_SUBMODULES = ("linalg", "fft", "special")
# Tensor-creating methods that torch.overrides classes as "ignored"; new_empty* stays out
# (uninitialized memory would make every comparison fail).
TENSOR_FACTORIES = ["new_ones", "new_zeros", "new_full", "new_tensor"]

# torch.distributed collectives and point-to-point ops that carry tensors. Object
# collectives (pickled Python objects), barriers and group management are left out.
DISTRIBUTED = [
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "broadcast", "all_reduce",
    "reduce", "all_gather", "gather", "scatter", "reduce_scatter", "all_to_all",
    "all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor",
    "_all_gather_base", "_reduce_scatter_base",
]

# Ascend torch_npu fused/custom ops (names as exported by torch_npu). Stream, device-limit,
# float-status and raw-memory utilities are left out: they are not tensor math.
TORCH_NPU = """
_npu_dropout _npu_flash_attention _npu_paged_attention _npu_reshape_and_cache
_npu_rotary_embedding atb._npu_flash_attention_prefix_v2 atb._npu_flash_attention_v2
atb._npu_paged_attention_v2 atb.npu_fused_add_topk_div atb.npu_mla_preprocess
atb.npu_multi_head_latent_attention atb.npu_paged_cache_load atb.npu_ring_mla
atb.npu_self_attention_prefix_encoder fast_gelu gather_pa_kv_cache npu_add_quant_gmm_
npu_add_quant_matmul_ npu_add_rms_norm npu_add_rms_norm_dynamic_mx_quant
npu_add_rms_norm_dynamic_quant npu_add_rms_norm_quant npu_add_rms_norm_v2
npu_advance_step_flashattn npu_all_gather_base_mm npu_all_gather_quant_mm
npu_all_to_all_matmul npu_all_to_all_quant_matmul npu_alltoallv_gmm npu_alltoallv_quant_gmm
npu_anchor_response_flags npu_anti_quant npu_apply_adam npu_apply_adam_w
npu_apply_rotary_pos_emb npu_attention_to_ffn npu_attention_update npu_batch_nms
npu_bert_apply_adam npu_block_sparse_attention npu_bmmV2 npu_bounding_box_decode
npu_bounding_box_encode npu_broadcast npu_ciou npu_clipped_swiglu npu_confusion_transpose
npu_conv2d npu_conv3d npu_conv_transpose2d npu_convert_weight_to_int4pack npu_convolution
npu_convolution_transpose npu_cross_entropy_loss npu_deformable_conv2d
npu_dense_lightning_indexer_grad_kl_loss npu_dense_lightning_indexer_softmax_lse
npu_dequant_swiglu_quant npu_diou npu_dropout_with_add_softmax npu_dtype_cast
npu_dual_level_quant_matmul npu_dynamic_block_mx_quant npu_dynamic_block_quant
npu_dynamic_dual_level_mx_quant npu_dynamic_mx_quant npu_dynamic_mx_quant_with_dual_axis
npu_dynamic_quant npu_dynamic_quant_asymmetric npu_fast_gelu npu_ffn npu_ffn_to_attention
npu_flash_attention npu_format_cast npu_format_cast_ npu_fused_attention_score
npu_fused_causal_conv1d npu_fused_floyd_attention npu_fused_infer_attention_score
npu_fused_infer_attention_score_v2 npu_fused_matmul npu_fusion_attention
npu_fusion_attention_v2 npu_fusion_attention_v3 npu_gather_sparse_index npu_geglu npu_gelu
npu_gelu_mul npu_gelu_quant npu_giou npu_gmm_alltoallv npu_grid_assign_positive
npu_group_norm_silu npu_group_norm_swish npu_group_quant npu_grouped_dynamic_block_quant
npu_grouped_dynamic_mx_quant npu_grouped_matmul npu_grouped_matmul_add_
npu_grouped_matmul_finalize_routing npu_grouped_matmul_swiglu_quant_v2 npu_gru npu_ifmr
npu_incre_flash_attention npu_indexing npu_interleave_rope npu_iou
npu_kronecker_quant npu_kv_quant_sparse_flash_attention npu_kv_rmsnorm_rope_cache
npu_layer_norm_eval npu_lightning_indexer npu_linear npu_lstm npu_masked_fill_range
npu_matmul_all_to_all npu_max npu_mhc_post npu_mhc_pre npu_mhc_sinkhorn npu_min npu_mish
npu_mla_prolog npu_mla_prolog_v2 npu_mla_prolog_v3 npu_mm_all_reduce_base
npu_mm_reduce_scatter_base npu_moe_compute_expert_tokens npu_moe_distribute_combine
npu_moe_distribute_combine_add_rms_norm npu_moe_distribute_combine_v2
npu_moe_distribute_dispatch npu_moe_distribute_dispatch_v2 npu_moe_finalize_routing
npu_moe_finalize_routing_v2 npu_moe_gating_top_k npu_moe_gating_top_k_softmax
npu_moe_init_routing npu_moe_init_routing_v2 npu_moe_re_routing npu_moe_token_permute
npu_moe_token_permute_with_routing_map npu_moe_token_unpermute npu_moe_update_expert
npu_mrope npu_multi_head_attention npu_nms_rotated npu_nms_v4 npu_nms_with_mask
npu_normalize_batch npu_one_hot npu_pad npu_prompt_flash_attention npu_ps_roi_pooling
npu_ptiou npu_quant_all_reduce npu_quant_fusion_attention npu_quant_gmm_alltoallv
npu_quant_lightning_indexer npu_quant_matmul npu_quant_matmul_all_to_all
npu_quant_matmul_gelu npu_quant_matmul_reduce_sum npu_quant_mm_reduce_scatter
npu_quant_reduce_scatter npu_quant_scatter npu_quant_scatter_ npu_quantize
npu_random_choice_with_mask npu_recurrent_gated_delta_rule npu_reshape npu_ring_mla
npu_rms_norm npu_rms_norm_dynamic_mx_quant npu_rms_norm_dynamic_quant npu_rms_norm_quant
npu_roi_align npu_roi_alignbk npu_rotary_mul npu_rotated_box_decode npu_rotated_box_encode
npu_rotated_iou npu_rotated_overlaps npu_scaled_masked_softmax npu_scatter
npu_scatter_nd_update npu_scatter_nd_update_ npu_scatter_pa_cache npu_scatter_pa_kv_cache
npu_sign_bits_pack npu_sign_bits_unpack npu_silu npu_sim_exponential_ npu_slice
npu_softmax_cross_entropy_with_logits npu_sort_v2 npu_sparse_flash_attention
npu_sparse_lightning_indexer_grad_kl_loss npu_stride_add npu_sub_sample npu_swiglu
npu_swiglu_mx_quant npu_swiglu_quant npu_top_k_top_p npu_top_k_top_p_sample
npu_trans_quant_param npu_transpose npu_transpose_batchmatmul
npu_transpose_quant_batchmatmul npu_weight_quant_batchmatmul npu_yolo_boxes_encode one_
scatter_update scatter_update_
""".split()

# aten ops the dispatcher-level dump must skip: views of metadata, aliasing and
# autograd bookkeeping, uninitialized allocations, and assertion / token ops.
EXCLUDE_ATEN = {
    "alias", "detach", "detach_", "lift", "lift_fresh", "lift_fresh_copy", "empty",
    "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "resize_", "set_", "_assert_async", "_assert_scalar", "_assert_tensor_metadata",
    "_functional_assert_async", "_functional_assert_scalar", "_make_dep_token",
    "_local_scalar_dense", "is_same_size", "is_nonzero", "record_stream",
    "_functional_sym_constrain_range", "_functional_sym_constrain_range_for_size",
    "_print", "_nested_tensor_from_mask_left_aligned", "_has_same_storage_numel",
    "_reshape_alias", "size", "stride", "numel", "dim",
    "_version", "output_nr", "_fw_primal", "_make_dual", "_unpack_dual",
    "_has_compatible_shallow_copy_type", "retain_grad", "retains_grad",
    "requires_grad_", "data", "_is_all_true", "_is_any_true", "_is_zerotensor",
    "is_pinned", "_pin_memory", "pin_memory", "_conj", "_neg_view", "conj", "resolve_conj",
    "resolve_neg", "_linalg_check_errors", "_fused_sdp_choice", "sparse_resize",
    "sparse_resize_", "sparse_resize_and_clear", "sparse_resize_and_clear_",
}
# Private aten prefixes for backend / sparse / nested / quantization internals.
EXCLUDE_ATEN_PREFIX = ("sym_", "_nested_", "_sparse_", "_cufft", "_test_", "_debug", "_has_", "_is_", "_propagate_",
                       "_validate_", "_autocast", "_use_", "_cslt", "_mps",
                       "_batch_norm_no_update", "_chunk_cat", "_dimI", "_dimV",
                       "_values", "_indices", "_coalesced", "_copy_from")
# aten op families that implement Python APIs under another name (F.pad ->
# reflection_pad2d, F.interpolate -> upsample_*, F.scaled_dot_product_attention ->
# _scaled_dot_product_*, torch.linalg.qr -> linalg_qr / _linalg_*, RNN kernels).
ATEN_COMPUTE_PREFIXES = (
    "reflection_pad", "replication_pad", "upsample_", "_upsample_", "_scaled_dot_product",
    "_flash_attention", "_efficient_attention", "linalg_", "_linalg_", "fft_", "_fft_",
    "special_", "rrelu_with_noise", "log_sigmoid", "nll_loss", "_cudnn_rnn", "mkldnn_rnn",
    "_thnn_fused", "cudnn_batch_norm", "miopen_batch_norm", "_addmm_activation",
    "_unsafe_index", "_unsafe_view", "im2col", "col2im", "_prelu_kernel", "_int_mm",
    "_weight_int", "_amp_", "_fused_", "_embedding_bag", "_cdist", "_pdist", "_euclidean_dist",
    "_log_softmax", "_softmax", "_masked_softmax", "_transformer_encoder", "_native_multi_head",
)
# aten name suffixes that mark a compute op's forward/backward pieces.
_ATEN_PARTS = ("_backward_data", "_backward_input", "_backward_weight", "_backward",
               "_forward", "_with_indices")


def _public(name):
    """Public or dunder: single-underscore names are private bookkeeping (``_version``)."""
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _keep(name):
    return _public(name) and name not in EXCLUDE and not name.startswith(SYM_PREFIX)


def functional_names():
    """nn.functional ops: every public function or builtin defined by torch."""
    names = {f.__name__ for f in get_overridable_functions()[F]}
    for name in dir(F):
        obj = getattr(F, name)
        if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)) and \
                (getattr(obj, "__module__", None) or "").startswith("torch"):
            names.add(name)
    return sorted(n for n in names if _keep(n) and hasattr(F, n))


def tensor_names():
    """torch.Tensor methods and operator dunders (properties are not calls)."""
    names = set(TENSOR_FACTORIES)
    for name in dir(torch.Tensor):
        raw = inspect.getattr_static(torch.Tensor, name)
        if isinstance(raw, (property, types.GetSetDescriptorType, types.MemberDescriptorType)):
            continue
        if callable(getattr(torch.Tensor, name, None)) and not inspect.isclass(raw):
            names.add(name)
    return sorted(n for n in names if _keep(n))


def torch_names():
    """torch.X functions (overridable + factories) plus linalg/fft/special as dotted names."""
    ov = get_overridable_functions()
    names = {f.__name__ for f in ov[torch]} | {f.__name__ for f in ov.get(torch.functional, ())}
    names = {n for n in names if _keep(n) and callable(getattr(torch, n, None))
             and not inspect.isclass(getattr(torch, n))}
    # In-place kernels (torch.relu_, torch.fill_) are public but not overridable.
    names |= {n for n in dir(torch._C._VariableFunctions)
              if n.endswith("_") and not n.startswith("__") and _keep(n) and hasattr(torch, n)}
    names |= {n for n in TORCH_FACTORIES if hasattr(torch, n)}
    names |= {n for n in TORCH_PRIVATE_COMPUTE if hasattr(torch, n)}
    for sub in TORCH_SUBMODULES:
        mod = getattr(torch, sub)
        funcs = {id(f) for f in ov.get(mod, ())}  # builtins are named linalg_norm: match by id
        # (only math lives here: linalg.cond is not the torch.cond control-flow op)
        names |= {f"{sub}.{n}" for n in dir(mod) if _public(n) and id(getattr(mod, n)) in funcs}
    return sorted(names)


def vf_names():
    """The ``_VF.X`` kernels torch's own Python code calls (RNNs, norms, splits)."""
    root = os.path.dirname(torch.__file__)
    found = set()
    for rel in ("functional.py", "nn/functional.py", "nn/modules/rnn.py", "_tensor.py"):
        path = os.path.join(root, rel)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                found |= set(re.findall(r"\b_VF\.([A-Za-z]\w*)", f.read()))
    return sorted(n for n in found if _keep(n) and hasattr(torch._VF, n))


def _aten_stem(name):
    """The Python-level API an aten op implements: ``native_layer_norm_backward`` -> layer_norm."""
    stem = name.lstrip("_")
    for part in _ATEN_PARTS:
        if stem.endswith(part):
            stem = stem[: -len(part)]
            break
    stem = stem.rstrip("_")
    for prefix in ("native_", "fused_", "foreach_"):
        if stem.startswith(prefix):
            stem = stem[len(prefix):]
    return stem


def _reaches_dispatcher(packet):
    """False when every overload is CompositeImplicitAutograd: it decomposes before L2."""
    for overload in packet.overloads():
        op = getattr(packet, overload)
        try:
            if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
                return True
        except RuntimeError:
            continue
    return False


def aten_names(python_names):
    """aten ops a model's compute reaches at the dispatcher: core ATen IR, the kernels
    behind the Python APIs listed above, their backward ops and the ``_foreach_`` ops."""
    all_ops = {o.split("::", 1)[1].split(".", 1)[0]
               for o in torch._C._dispatch_get_all_op_names() if o.startswith("aten::")}
    stems = {n.split(".")[-1].rstrip("_") for n in python_names}
    keep = set()
    for name in all_ops:
        if name in EXCLUDE_ATEN or name.startswith(EXCLUDE_ATEN_PREFIX):
            continue
        packet = getattr(torch.ops.aten, name, None)
        if packet is None or not _reaches_dispatcher(packet):
            continue
        core = any(torch.Tag.core in getattr(packet, o).tags for o in packet.overloads())
        if core or name.startswith(("_foreach_",) + ATEN_COMPUTE_PREFIXES) \
                or _aten_stem(name) in stems or name.rstrip("_") in stems:
            keep.add(name)
    # Backward kernels of kept ops (slice_backward, select_backward) whose forward
    # has no Python-level name of its own.
    for name in all_ops - keep:
        if name.endswith("_backward") and name[: -len("_backward")] in keep and \
                name not in EXCLUDE_ATEN and _reaches_dispatcher(getattr(torch.ops.aten, name)):
            keep.add(name)
    return sorted(keep)


def build():
    """section -> sorted names."""
    functional, tensor, torch_ = functional_names(), tensor_names(), torch_names()
    return {
        "functional": functional,
        "tensor": tensor,
        "torch": torch_,
        "_VF": vf_names(),
        "distributed": sorted(set(DISTRIBUTED)),
        "torch_npu": sorted(set(TORCH_NPU)),
        "aten": aten_names(set(functional) | set(tensor) | set(torch_)),
        "custom": ['"*"'],   # every torch.ops namespace torch does not ship (hook_module/custom_ops.py)
    }


HEADER = """\
# APIs probe hooks and dumps, one list per section.
# Generated by scripts/gen_support_wrap_ops.py from torch {version}, then curated;
# edit freely: delete a line to stop dumping that API, add a name to start.
# functional: torch.nn.functional.X -> Functional.X    tensor: torch.Tensor.X -> Tensor.X
# torch: torch.X (dotted: torch.linalg.X) -> Torch.X   _VF: torch._VF.X -> VF.X
# distributed: torch.distributed.X -> Distributed.X    torch_npu: torch_npu.X -> NPU.X
# aten: aten op names without overload, for the dispatcher-level (L2) dump.
# custom: torch.ops operators outside torch (vLLM's _C, torch_npu's npu, torch.library ops)
#   -> Custom.{{namespace}}.{{op}}: "*" every namespace torch does not ship, "ns" one namespace,
#   "ns.op" one op.
"""


def render(sections):
    lines = [HEADER.format(version=torch.__version__.split("+")[0])]
    for section in SECTIONS:
        lines.append(f"{section}:")
        lines.extend(f"  - {name}" for name in sections[section])
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", help="write here instead of stdout")
    args = parser.parse_args(argv)
    text = render(build())
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
