"""Mutation tables (parity/mutate.py) of the ports the toolkit is proven on without extras: this
repository's nanoGPT block and TRM block, the cookbook MLP, the UNet up-block (convolutions and
GroupNorm by rule, channels-last), an LSTM and a GRU tagger (parity.layers by rule) and
nn.MultiheadAttention (parity.layers by rule). Each SPEC is a function returning a
`parity.mutate.Spec`:

    python -m parity mutate tests.parity_mutants:gpt_block

tests/test_parity_mutate.py runs them; the transformers ports' tables are in
tests/test_parity_zoo.py (slow tier, `zoo` extra).
"""

from __future__ import annotations

import torch
from flax import nnx

from parity import layers
from parity.keymap import load_torch, param_dtype
from parity.mutate import Mutant, Spec


def randomized(module, seed: int, scale: float = 0.3):
    """Every parameter from a seeded normal times `scale`: norm scales and biases that start at
    one and zero become random, so that swapping or dropping them changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


# ------------------------------------------------------------------------------------ nanoGPT

GPT_BLOCK = dict(
    block_size=8, vocab_size=11, n_layer=1, n_head=4, n_embd=32, dropout=0.0, bias=True
)


def torch_gpt_block():
    """TORCH_FACTORY: parity.gpt_torch.Block (flash attention, causal), random weights, (2, 8, 32)."""
    from parity import gpt_torch

    block = gpt_torch.Block(gpt_torch.GPTConfig(**GPT_BLOCK))
    return randomized(block, 0), (_x(2, 8, 32),)


def nnx_gpt_block(torch_module):
    from models.gpt.modeling import Block, GPTConfig

    cfg = GPTConfig(**GPT_BLOCK, dtype=param_dtype(torch_module))
    return load_torch(Block(cfg, rngs=nnx.Rngs(0)), torch_module)


def gpt_block() -> Spec:
    return Spec(
        "nanoGPT block",
        torch_gpt_block,
        nnx_gpt_block,
        [
            Mutant("transpose_output", ""),
            Mutant("permute_axes", "", option=(0, (1, 0, 2))),
            Mutant("drop_position", ""),
            Mutant("permute_heads", "attn.c_attn", option=(4, 0, 32)),  # the query third
            Mutant("drop_bias", "attn.c_proj"),
            Mutant("eps_x10", "ln_2"),
            Mutant(
                "swap_weights",
                "",
                names="ln_1",
                option=(("ln_1.scale", None), ("ln_2.scale", None)),
            ),
            Mutant("other_gelu", "mlp"),
            Mutant("causal_off_by_one", "attn"),
            Mutant("drop_residual", ""),
        ],
        {
            "rope_theta": "learned positions, added before the blocks: no rotary embedding",
            "skip_cast": "its casts serve a mixed policy (float32 weights, bf16 compute) that a "
            "pure bf16 run cannot compare; in float32 and float64 they cast to what they have",
        },
    )


# ---------------------------------------------------------------------------------------- TRM


def _trm_config():
    from parity.trm_fixtures import tiny_config

    return tiny_config("att")


def torch_trm_block():
    """TORCH_FACTORY: parity.trm_torch's post-norm Block (attention, SwiGLU), random weights, the
    rotary tables of its RotaryEmbedding and (2, 16, 64) hidden states, as keyword inputs."""
    from parity.trm_torch.layers import RotaryEmbedding
    from parity.trm_torch.modeling import Block

    cfg = _trm_config()
    torch.manual_seed(0)
    block = Block(cfg)
    cos, sin = RotaryEmbedding(cfg.head_dim, 16, cfg.rope_theta)()
    return block, (), {"cos_sin": (cos, sin), "hidden_states": _x(2, 16, cfg.hidden_size)}


def nnx_trm_block(torch_module):
    from models.trm.modeling import Block

    return load_torch(Block(_trm_config(), rngs=nnx.Rngs(0)), torch_module)


# What a skipped float32 upcast does in a bf16 run, and why no dtype of the diff catches it
SKIPPED_CAST = (
    "no dtype catches it: float32 and float64 runs cast to what they have, and in bf16 the scores"
    " and softmax without their float32 upcast move the output by about 2 x torch's own bf16"
    " error, inside the 3 x of BFLOAT16_AS_TORCH"
)


def trm_block() -> Spec:
    half = slice(0, 256), slice(256, 512)  # gate_up_proj's gate and up rows
    return Spec(
        "TRM block",
        torch_trm_block,
        nnx_trm_block,
        [
            Mutant("transpose_output", ""),
            Mutant("drop_position", ""),
            Mutant("permute_heads", "self_attn.qkv_proj", option=(4, 0, 64)),  # the query part
            Mutant("eps_x10", "", option="norm_eps"),
            Mutant(
                "swap_weights",
                "",
                names="mlp.gate_up_proj",
                option=(("mlp.gate_up_proj.weight", half[0]), ("mlp.gate_up_proj.weight", half[1])),
            ),
            Mutant("drop_residual", "", option="hidden_states"),
            Mutant(
                "skip_cast",
                "self_attn",
                "bfloat16",
                option="models.trm.layers:compute_dtype",
                finding=SKIPPED_CAST,
            ),
        ],
        {
            "permute_axes": "no output with more than one axis of its own size to reorder but "
            "the hidden states (transpose_output)",
            "drop_bias": "CastedLinear without bias throughout",
            "other_gelu": "SwiGLU (SiLU): no GELU",
            "rope_theta": "the rotary tables are an input of the block: a block alone cannot "
            "check theta",
            "causal_off_by_one": "bidirectional attention: no causal mask",
        },
    )


# ----------------------------------------------------------------------------- the cookbook MLP


def mlp() -> Spec:
    from tests import test_parity_mlp as m

    return Spec(
        "cookbook MLP",
        m.torch_mlp,
        m.nnx_mlp,
        [
            Mutant("transpose_output", ""),
            Mutant("drop_position", ""),
            Mutant("drop_bias", "fc1"),
            Mutant("eps_x10", "norm"),
            Mutant(
                "swap_weights", "", names="norm", option=(("norm.scale", None), ("norm.bias", None))
            ),
            Mutant("other_gelu", ""),  # the GELU runs inline, in the model's own code
            Mutant("drop_residual", "", option={"from": "norm"}),  # x + fc2(...): x dropped
        ],
        {
            "permute_axes": "(B, T, D) outputs only: transpose_output covers their order",
            "permute_heads": "no attention",
            "rope_theta": "no rotary embedding",
            "causal_off_by_one": "no attention",
            "skip_cast": "no casts: every module computes in the run's dtype",
        },
    )


# ------------------------------------------------------------------------ UNet up-block (conv)


def conv() -> Spec:
    from tests import parity_upblock as up

    return Spec(
        "UNet up-block (Conv2d, ConvTranspose2d, GroupNorm; channels-last)",
        up.torch_up,
        up.nnx_up,
        [
            Mutant("transpose_output", ""),
            Mutant("drop_position", "", option=(0, 2)),
            Mutant("drop_bias", "conv"),
            Mutant("eps_x10", "norm"),
            Mutant(
                "swap_weights", "", names="conv", option=(("conv.bias", None), ("skip.bias", None))
            ),
        ],
        {
            "permute_axes": "one (N, C, H, W) output: transpose_output reorders it",
            "permute_heads": "no attention",
            "other_gelu": "SiLU: no GELU",
            "rope_theta": "no rotary embedding",
            "causal_off_by_one": "no attention",
            "drop_residual": "no module whose output has its input's shape: the skip path runs "
            "through a 1x1 conv and the upsampling",
            "skip_cast": "no casts",
        },
    )


# ------------------------------------------------------------------------- LSTM and GRU taggers

VOCAB, DIM, HIDDEN, LAYERS, OUT = 20, 8, 12, 2, 5


class TorchRecurrentTagger(torch.nn.Module):
    """ids -> Embedding -> LSTM / GRU (2 layers, batch_first) -> Linear on every step."""

    def __init__(self, kind: str):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.rnn = getattr(torch.nn, kind)(DIM, HIDDEN, LAYERS, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, OUT)

    def forward(self, ids):
        y, _ = self.rnn(self.embed(ids))
        return self.head(y)


class RecurrentTagger(nnx.Module):
    def __init__(self, kind: str, *, param_dtype="float32", rngs):
        dt = dict(param_dtype=param_dtype, rngs=rngs)
        self.embed = nnx.Embed(VOCAB, DIM, **dt)
        self.rnn = getattr(layers, kind)(DIM, HIDDEN, LAYERS, batch_first=True, **dt)
        self.head = nnx.Linear(HIDDEN, OUT, **dt)

    def __call__(self, ids):
        y, _ = self.rnn(self.embed(ids))
        return self.head(y)


def _torch_tagger(kind):
    def factory():
        torch.manual_seed(0)
        ids = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(1))
        return TorchRecurrentTagger(kind), (ids,)

    factory.__name__ = f"torch_{kind.lower()}_tagger"
    return factory


def _nnx_tagger(kind):
    def factory(torch_module):
        port = RecurrentTagger(kind, param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0))
        return load_torch(port, torch_module)

    factory.__name__ = f"nnx_{kind.lower()}_tagger"
    return factory


torch_lstm_tagger, nnx_lstm_tagger = _torch_tagger("LSTM"), _nnx_tagger("LSTM")
torch_gru_tagger, nnx_gru_tagger = _torch_tagger("GRU"), _nnx_tagger("GRU")

_RECURRENT_NOT_APPLICABLE = {
    "permute_axes": "(B, T, classes) outputs only: transpose_output covers their order",
    "permute_heads": "no attention",
    "eps_x10": "no norm",
    "other_gelu": "no GELU",
    "rope_theta": "no rotary embedding",
    "causal_off_by_one": "no attention",
    "drop_residual": "no residual",
    "skip_cast": "no casts",
}


def _recurrent(kind: str) -> Spec:
    torch_factory, nnx_factory = _torch_tagger(kind), _nnx_tagger(kind)
    dense = "rnn.layers.{}.cell.dense_h.kernel"
    return Spec(
        f"{kind} tagger",
        torch_factory,
        nnx_factory,
        [
            Mutant("transpose_output", ""),
            Mutant("drop_position", ""),
            Mutant("drop_bias", "head"),
            # the hidden-to-hidden weights of the two layers, each in the other's place
            Mutant(
                "swap_weights",
                "",
                names="rnn",
                option=((dense.format(0), None), (dense.format(1), None)),
            ),
        ],
        _RECURRENT_NOT_APPLICABLE,
    )


def lstm() -> Spec:
    return _recurrent("LSTM")


def gru() -> Spec:
    return _recurrent("GRU")


# ------------------------------------------------------------------------- MultiheadAttention

E, N, T = 16, 4, 6


def torch_mha():
    """TORCH_FACTORY: nn.MultiheadAttention (batch_first) on a causal bool mask, returning the
    attention weights of every head, (B, heads, T, S)."""
    torch.manual_seed(0)
    x = _x(2, T, E)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # True: may not attend
    module = torch.nn.MultiheadAttention(E, N, batch_first=True)
    return randomized(module, 0), (x, x, x), {"attn_mask": mask, "average_attn_weights": False}


def nnx_mha(torch_module):
    port = layers.MultiheadAttention(
        E, N, batch_first=True, param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0)
    )
    return load_torch(port, torch_module)


def mha() -> Spec:
    return Spec(
        "nn.MultiheadAttention",
        torch_mha,
        nnx_mha,
        [
            Mutant("transpose_output", ""),
            Mutant("permute_axes", "", option=(1, (0, 2, 3, 1))),  # weights (B, T, S, heads)
            Mutant("drop_position", ""),
            # the port's own projections have no torch counterpart: named at the attention
            Mutant("permute_heads", "query", names="", option=(N, 0, E)),
            Mutant("drop_bias", "value", names=""),
            Mutant("swap_weights", "", option=(("query.kernel", None), ("key.kernel", None))),
        ],
        {
            "eps_x10": "no norm",
            "other_gelu": "no GELU",
            "rope_theta": "no rotary embedding",
            "causal_off_by_one": "the mask is an input",
            "drop_residual": "no residual",
            "skip_cast": "no casts: flax's attention written out in the inputs' dtype",
        },
    )


SPECS = {
    "gpt_block": gpt_block,
    "trm_block": trm_block,
    "mlp": mlp,
    "conv": conv,
    "lstm": lstm,
    "gru": gru,
    "mha": mha,
}
