"""Which attention implementation runs: the `attention_impl` rules shared by both ports.

`GPTConfig.attention_impl` and `TRMConfig.attention_impl` take the same values:
"explicit" is each port's written-out attention (what every parity test is proven against);
"xla" and "cudnn" are `jax.nn.dot_product_attention`'s implementations; "auto" picks "cudnn"
where it can run, else "explicit". torch's SDPA chooses flash / mem-efficient / math kernels by
itself; here the choice is explicit. Both ports resolve the value per call, at trace time, with
`resolve_attention_impl`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ATTENTION_IMPLS = ("auto", "explicit", "xla", "cudnn")


def cuda_compute_capability() -> tuple[int, int] | None:
    """(major, minor) of the default device if it is an NVIDIA GPU, else None."""
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
    why = cudnn_unsupported_without_device(jnp.dtype(dtype).name, head_size)
    if why:
        return why
    if cc is None:
        return f"the default JAX backend is {jax.default_backend()!r}, not an NVIDIA GPU"
    h_max = 256 if cc >= (9, 0) else 128
    if head_size > h_max:
        return f"head size {head_size} > {h_max} (the maximum at compute capability {cc})"
    return None


def resolve_attention_impl(
    requested: str, dtype, head_dim: int, *, dropout_active: bool = False, owner: str = ""
) -> str:
    """`attention_impl` -> the implementation this call runs: explicit | xla | cudnn.

    Resolved at trace time (backend, dtype and train/eval mode are static there). "auto" never
    raises; "xla" or "cudnn" where it cannot run raises instead of falling back silently.
    `dropout_active`: attention-probability dropout is on (GPT in train mode with dropout > 0),
    which jax.nn.dot_product_attention cannot do. `owner` names the config in the messages
    ("GPTConfig", "TRMConfig").
    """
    field = f"{owner}.attention_impl" if owner else "attention_impl"
    if requested not in ATTENTION_IMPLS:
        raise ValueError(f"{field}={requested!r}: expected one of {ATTENTION_IMPLS}")
    if requested == "explicit":
        return "explicit"
    # jax.nn.dot_product_attention has no dropout argument (torch's SDPA has dropout_p).
    why = (
        "attention dropout is active (dropout > 0 in train mode) and "
        "jax.nn.dot_product_attention has no dropout"
        if dropout_active
        else None
    )
    if requested == "xla":
        if why:
            raise ValueError(f"{field}='xla' cannot run: {why}; use 'explicit'")
        return "xla"
    why = why or cudnn_unsupported(dtype, head_dim, cuda_compute_capability())
    if requested == "auto":
        return "explicit" if why else "cudnn"
    if why:
        raise ValueError(
            f"{field}='cudnn' cannot run: {why}; "
            "use 'auto' (cudnn where possible, else explicit), 'xla' or 'explicit'"
        )
    return "cudnn"
