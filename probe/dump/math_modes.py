"""The math modes that set a device's precision for a dtype, as dump.json records them.

Two correct devices differ beyond rounding where a setting lets their matrix units keep
fewer bits (TF32 on CUDA, HF32 on Ascend: ~5e-4 relative per product, against fp32's
6e-8) or reduce fp16/bf16 sums in reduced precision. The compare names them next to the
precision it measures per API on the run (compare/diagnosis.py), so a reader sees why an
NPU's matrix products all carry the same excess. Read at each step's start: a few
attribute reads, no device work. (torch is imported in the function: the compare reads
``reduced_precision`` without it.)
"""


def math_modes() -> dict:
    """{setting: value} for the settings this torch (and torch_npu, once imported) has."""
    import torch
    modes: dict = {"float32_matmul_precision": torch.get_float32_matmul_precision()}
    backends = torch.backends
    for key, owner, attr in (
            ("cuda.matmul.allow_tf32", getattr(backends, "cuda", None), "matmul.allow_tf32"),
            ("cudnn.allow_tf32", getattr(backends, "cudnn", None), "allow_tf32"),
            ("cuda.matmul.allow_fp16_reduced_precision_reduction", getattr(backends, "cuda", None),
             "matmul.allow_fp16_reduced_precision_reduction"),
            ("cuda.matmul.allow_bf16_reduced_precision_reduction", getattr(backends, "cuda", None),
             "matmul.allow_bf16_reduced_precision_reduction"),
            ("npu.matmul.allow_hf32", getattr(torch, "npu", None), "matmul.allow_hf32"),
            ("npu.conv.allow_hf32", getattr(torch, "npu", None), "conv.allow_hf32")):
        value = owner
        try:
            for part in attr.split("."):
                value = getattr(value, part)
        except Exception:   # noqa: BLE001 - a backend this torch lacks (or that raises): not recorded
            continue
        if owner is not None and isinstance(value, (bool, int, str)):
            modes[key] = value
    return modes


def reduced_precision(modes: dict) -> list:
    """The settings in ``modes`` that let a device compute fp32 products with fewer bits."""
    on = [k for k in ("cuda.matmul.allow_tf32", "cudnn.allow_tf32", "npu.matmul.allow_hf32",
                      "npu.conv.allow_hf32") if modes.get(k) is True]
    if modes.get("float32_matmul_precision") in ("high", "medium"):
        on.append(f"float32_matmul_precision={modes['float32_matmul_precision']}")
    return on
