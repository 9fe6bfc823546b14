"""TRMConfig: upstream's config field names and the arch/trm.yaml defaults, plus our options."""

from __future__ import annotations

import dataclasses

# TRMConfig.attention_impl: the same values and rules as GPTConfig's (models/attention.py).
from models.attention import ATTENTION_IMPLS
from models.fields import check_ranges, ranged
from models.trm.losses import LOSS_DTYPES, LOSS_TYPES

ARCHS = ("trm", "hrm", "trm_singlez", "trm_hier6", "transformers_baseline")
# TRMConfig.remat_policy: what jax.checkpoint keeps of a block for the backward pass (the names of
# jax.checkpoint_policies). nothing_saveable recomputes the whole block; the dots policies keep the
# matmul outputs and recompute only the elementwise work (norms, SwiGLU, residual adds).
REMAT_POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")
# TRMConfig.embed_grad: how the token embedding's gradient is summed (models/trm/layers.py
# CastedEmbedding); the forward is the same for all three.
EMBED_GRADS = ("onehot", "scatter_f32", "scatter_bf16")

# TRMConfig's fields fall in two lists; a field in neither (one a fork adds) is a variant without
# an upstream twin, refused by the PyTorch reference and kept out of upstream-format files when
# set away from its default (`variant_fields`). The recipe:
# docs/architecture.md, "Changing the model where upstream has no counterpart"
# Upstream's model and loss: its arch yaml and arch.loss, the sizes its data gives, and `arch`
# (which of its five model files), each of whose values the PyTorch reference (parity/trm_torch)
# builds (loss_type: an argument of its ACTLossHead); and `loss_dtype`, the precision upstream's
# float64 loss runs at here (the reference's loss is float64 whatever it says).
UPSTREAM_FIELDS = (
    "batch_size", "seq_len", "puzzle_emb_ndim", "num_puzzle_identifiers", "vocab_size",
    "H_cycles", "L_cycles", "H_layers", "L_layers", "hidden_size", "expansion", "num_heads",
    "pos_encodings", "rms_norm_eps", "rope_theta", "halt_max_steps", "halt_exploration_prob",
    "forward_dtype", "mlp_t", "puzzle_emb_len", "no_ACT_continue", "act_enabled", "act_inference",
    "loss_type", "loss_dtype", "arch",
)  # fmt: skip
# This port's ways of computing the same function (memory, HLO size, kernels, how a gradient is
# summed): the reference computes upstream's way whatever they say, and a run resumes across them.
SAME_FUNCTION_FIELDS = (
    "attention_impl", "remat", "remat_policy", "scan", "embed_grad", "split_gate_up",
)  # fmt: skip


def swiglu_intermediate(width: int, expansion: float) -> int:
    """Hidden width of upstream's SwiGLU over `width` features: round(expansion * width * 2/3)
    with Python's round (banker's rounding, as upstream), rounded up to a multiple of 256. The
    blocks' channel MLP uses width = hidden_size, the mlp_t token MLP width = total_len."""
    return -(round(expansion * width * 2 / 3) // -256) * 256


@dataclasses.dataclass(frozen=True)
class TRMConfig:
    # Data fields (upstream fills them from dataset.json and the trainer); Sudoku-Extreme values.
    batch_size: int = 768
    seq_len: int = 81
    # The upstream class default is 0, but every arch yaml sets it to hidden_size; we default to
    # the value that actually runs (README Sudoku/ARC/Maze commands).
    puzzle_emb_ndim: int = ranged(512, ">=0")
    num_puzzle_identifiers: int = 1
    vocab_size: int = 11

    # arch/trm.yaml
    H_cycles: int = ranged(3, ">0")
    L_cycles: int = ranged(6, ">0")
    H_layers: int = ranged(0, ">=0")  # ignored by TRM; HRM and the transformer baseline use it
    L_layers: int = ranged(2, ">=0")
    hidden_size: int = ranged(512, ">0")
    expansion: float = ranged(4, ">0")
    num_heads: int = ranged(8, ">0")
    pos_encodings: str = "rope"  # "rope" | "learned" | anything else: none
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    halt_max_steps: int = ranged(16, ">0")
    halt_exploration_prob: float = 0.1
    forward_dtype: str = "bfloat16"
    mlp_t: bool = False
    puzzle_emb_len: int = ranged(16, ">=0")  # 0: ceil(puzzle_emb_ndim / hidden_size)
    no_ACT_continue: bool = True

    # transformers_baseline (Model_ACTV2) switches
    act_enabled: bool = True
    act_inference: bool = False

    # arch.loss (upstream's ACTLossHead, models.trm.act_loss): the loss type, and the dtype of the
    # loss: upstream's stablemax runs in float64, which needs jax x64 (the trainer turns it on);
    # "float32" accepts a float32 loss instead (docs/porting_trm.md)
    loss_type: str = "stablemax_cross_entropy"  # one of LOSS_TYPES
    loss_dtype: str = "float64"  # one of LOSS_DTYPES

    # Our options (not upstream)
    arch: str = "trm"  # one of ARCHS: selects the inner recursion
    remat: bool = False  # jax.checkpoint around every block (same values, less memory)
    remat_policy: str = "nothing_saveable"  # one of REMAT_POLICIES; used when remat is True
    scan: bool = False  # lax.scan over the L cycles instead of a Python loop (smaller HLO)
    # One of ATTENTION_IMPLS. torch's SDPA picks flash / mem-efficient / math kernels itself; here
    # the choice is explicit, and "auto" is "explicit" except on an NVIDIA GPU in bf16/fp16.
    attention_impl: str = "auto"
    # One of EMBED_GRADS. "onehot": a one-hot matmul with float32 sums; "scatter_bf16" sums the
    # rows in the forward dtype, as a gather of the bf16-cast table differentiates
    embed_grad: str = "onehot"
    # SwiGLU's gate and up as two matmuls on the halves of gate_up_proj's weight (same weights and
    # values; the backward adds two products instead of concatenating the halves' gradients)
    split_gate_up: bool = False

    def __post_init__(self):
        check_ranges(self)
        choices = {
            "arch": ARCHS,
            "loss_type": LOSS_TYPES,
            "loss_dtype": LOSS_DTYPES,
            "remat_policy": REMAT_POLICIES,
            "embed_grad": EMBED_GRADS,
            "attention_impl": ATTENTION_IMPLS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"TRMConfig.{name}={getattr(self, name)!r}: expected one of {allowed}"
                )
        if self.forward_dtype not in ("float32", "bfloat16", "float64", "float16"):
            raise ValueError(
                f"TRMConfig.forward_dtype={self.forward_dtype!r}: expected float32, bfloat16, "
                "float16 or float64"
            )
        # What is known before any device is seen (jax's cuDNN checks; the device ones run at
        # trace time: models/attention.py).
        if self.attention_impl == "cudnn" and self.forward_dtype not in ("bfloat16", "float16"):
            raise ValueError(
                f"TRMConfig.attention_impl='cudnn' cannot run: forward_dtype is "
                f"{self.forward_dtype}, cuDNN flash attention needs bfloat16 or float16; use "
                "'auto' (cudnn where possible, else explicit), 'xla' or 'explicit'"
            )
        if self.attention_impl == "cudnn" and self.hidden_size >= self.num_heads > 0:
            if self.head_dim % 8:
                raise ValueError(
                    f"TRMConfig.attention_impl='cudnn' cannot run: head_dim {self.head_dim} "
                    f"(hidden_size {self.hidden_size} // num_heads {self.num_heads}) is not a "
                    "multiple of 8; use 'auto', 'xla' or 'explicit'"
                )
        if (
            not self.block_mlp_t
            and self.arch != "trm_singlez"
            and self.hidden_size < self.num_heads
        ):
            raise ValueError(
                f"TRMConfig: hidden_size={self.hidden_size} < num_heads={self.num_heads}"
            )
        if self.arch == "trm_hier6" and self.L_cycles > 6:
            raise ValueError(
                f"TRMConfig: trm_hier6 has 6 latents, needs L_cycles <= 6, got {self.L_cycles}"
            )
        if self.arch == "transformers_baseline" and self.pos_encodings not in ("rope", "learned"):
            raise ValueError(
                "TRMConfig: transformers_baseline needs pos_encodings 'rope' or 'learned' "
                f"(upstream raises NotImplementedError), got {self.pos_encodings!r}"
            )

    @property
    def prefix_len(self) -> int:
        """Rows of the puzzle-embedding prefix actually prepended to the tokens.

        Upstream TRM uses `puzzle_emb_len` (or ceil(ndim/hidden) when it is 0); HRM and the
        baseline always use ceil(ndim/hidden). With puzzle_emb_ndim=0 no prefix is prepended, and
        upstream TRM still counts puzzle_emb_len rows in its shapes (Sudoku: 97 vs 81, a crash):
        we use 0, which is what upstream computes when puzzle_emb_len=0 as well.
        """
        if self.puzzle_emb_ndim <= 0:
            return 0
        ceil_len = -(self.puzzle_emb_ndim // -self.hidden_size)
        if self.arch in ("hrm", "transformers_baseline") or self.puzzle_emb_len == 0:
            return ceil_len
        return self.puzzle_emb_len

    @property
    def block_mlp_t(self) -> bool:
        """Whether the blocks mix tokens with an MLP (`mlp_t`) instead of attention.

        The transformers_baseline's blocks are attention blocks whatever `mlp_t` says: upstream's
        baseline config has no `mlp_t` field (an extra key is ignored) and its block has no
        token-mixing branch. Our torch reference builds the same blocks.
        """
        return self.mlp_t and self.arch != "transformers_baseline"

    @property
    def total_len(self) -> int:
        return self.seq_len + self.prefix_len

    @property
    def head_dim(self) -> int:
        # transformers_baseline with 12 heads at 512: head_dim 42, attention width 504 (as upstream).
        return self.hidden_size // self.num_heads


def variant_fields(config) -> dict:
    """name -> value of each field of the dataclass `config` that is in neither UPSTREAM_FIELDS
    nor SAME_FUNCTION_FIELDS and is set away from its default: what makes it a model upstream
    does not have. Empty for upstream's models (and for a non-dataclass config)."""
    if not dataclasses.is_dataclass(config):
        return {}
    listed = {*UPSTREAM_FIELDS, *SAME_FUNCTION_FIELDS}
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if f.name not in listed and getattr(config, f.name) != _default(f)
    }


def upstream_config(config):
    """`config` with its variant fields (`variant_fields`) at their defaults: the upstream model
    the variant departs from."""
    fields = {f.name: f for f in dataclasses.fields(config)}
    return dataclasses.replace(
        config, **{name: _default(fields[name]) for name in variant_fields(config)}
    )


def _default(field: dataclasses.Field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default  # MISSING for a field without a default: every value differs from it
