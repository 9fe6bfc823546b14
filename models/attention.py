"""Which attention implementation runs: the `attention_impl` rules shared by both ports.

`GPTConfig.attention_impl` and `TRMConfig.attention_impl` take the same values:
"explicit" is each port's written-out attention (what every parity test is proven against);
"xla" and "cudnn" are `jax.nn.dot_product_attention`'s implementations; "auto" picks "cudnn"
where it can run, else "explicit". torch's SDPA chooses flash / mem-efficient / math kernels by
itself; here the choice is explicit. Each port resolves the value per call
(`resolve_attention_impl` in models/gpt/modeling.py and models/trm/layers.py) with these rules.

This module imports jax only inside the functions that need a device: models/trm/config.py
imports it and must stay loadable without jax.
"""

from __future__ import annotations

ATTENTION_IMPLS = ("auto", "explicit", "xla", "cudnn")


def cuda_compute_capability() -> tuple[int, int] | None:
    """(major, minor) of the default device if it is an NVIDIA GPU, else None."""
    import jax  # lazy: models/trm/config.py imports this module and must load without jax

    if jax.default_backend() != "gpu":
        return None
    try:  # CUDA devices report e.g. "9.0"; ROCm ones a gfx name, which does not parse
        major, minor = (int(v) for v in str(jax.devices()[0].compute_capability).split("."))
    except (AttributeError, ValueError):
        return None
    return major, minor


def cudnn_unsupported_without_device(dtype_name: str, head_size: int) -> str | None:
    """The cuDNN rules known before any device is seen: bf16/fp16 inputs, head size % 8 == 0."""
    if dtype_name not in ("bfloat16", "float16"):
        return f"the dtype is {dtype_name}; cuDNN flash attention needs bfloat16 or float16"
    if head_size % 8:
        return f"head size {head_size} is not a multiple of 8"
    return None


def cudnn_unsupported(dtype, head_size: int, cc: tuple[int, int] | None) -> str | None:
    """Why cuDNN flash attention cannot run (None: it can); cc: the GPU's compute capability.

    The rules are jax's own checks (jax/_src/cudnn/fused_attention_stablehlo.py): bf16/fp16 inputs,
    head size a multiple of 8 and <= 128 (<= 256 from Hopper, compute capability 9.0, on).
    """
    import jax  # lazy, as above: the config modules load without jax
    import jax.numpy as jnp

    why = cudnn_unsupported_without_device(jnp.dtype(dtype).name, head_size)
    if why:
        return why
    if cc is None:
        return f"the default JAX backend is {jax.default_backend()!r}, not an NVIDIA GPU"
    h_max = 256 if cc >= (9, 0) else 128
    if head_size > h_max:
        return f"head size {head_size} > {h_max} (the maximum at compute capability {cc})"
    return None
