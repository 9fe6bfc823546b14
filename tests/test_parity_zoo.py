"""The toolkit on modules of real models no one here wrote, built from the installed PyPI packages
with random weights, offline (the `zoo` extra: transformers, segment-anything; skipped with a
reason without it): transformers' T5 encoder block (relative attention bias, T5's RMS norm, the
gated-GELU feed-forward), a two-layer Qwen2Model with its rotary module (q/k/v biases, the causal
mask built in the model), Whisper's encoder layer, segment-anything's image-encoder block
(windowed attention, decomposed relative positions) and its mask decoder's upscaling path
(ConvTranspose2d + LayerNorm2d), and transformers' EnCodec LSTM (two layers). Each port
(tests/zoo_ports.py): weights EXACT, every module's output and every gradient within FLOAT64
(transformers' own float32 casts run in float64, as the diff runs them: parity/promote.py) and
FLOAT32, transformers' modules in bf16 too; three AdamW steps within FLOAT64; a wrong port that
the diff names; and a mutation table per transformers / SAM port (parity/mutate.py) whose every
mutant the diff fails at the module it was made in, but for the findings written in its rows.
Slow tier (`make test-slow` installs the extra); by hand:

    python -m parity diff tests.test_parity_zoo:torch_t5_block tests.test_parity_zoo:nnx_t5_block
    python -m parity mutate tests.test_parity_zoo:qwen2_model_mutants
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
from flax import nnx

torch = pytest.importorskip("torch")
ZOO = "needs the zoo extra (make test-slow installs it; or pip install -e '.[zoo]')"
pytest.importorskip("transformers", reason=f"transformers {ZOO}")
if importlib.util.find_spec("segment_anything") is None:
    pytest.skip(f"segment-anything {ZOO}", allow_module_level=True)

pytestmark = pytest.mark.slow  # diffs, steps and mutants of six real models' modules

from parity import mutate  # noqa: E402
from parity.check import format_report  # noqa: E402
from parity.diff import diff  # noqa: E402
from parity.keymap import load_torch, param_dtype  # noqa: E402
from parity.mutate import Mutant, Spec  # noqa: E402
from parity.promote import promoted_casts  # noqa: E402
from parity.steps import AdamW, compare_steps  # noqa: E402
from tests import zoo_ports  # noqa: E402


def sam_modeling():
    """segment_anything.modeling without the package's __init__, which imports its predictor and
    through it torchvision (not needed by the model code, not installed)."""
    if "segment_anything" not in sys.modules:
        spec = importlib.util.find_spec("segment_anything")
        pkg = types.ModuleType("segment_anything")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["segment_anything"] = pkg
    import segment_anything.modeling as modeling

    return modeling


def _randomize(module, seed: int):
    """Every parameter from a seeded normal (scaled to 0.5), so that zero-initialised tensors
    (SAM's relative positions, T5's norm weight of ones) are random too."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


# ------------------------------------------------------------------------------------------- T5

T5 = dict(
    d_model=16, d_kv=4, num_heads=4, d_ff=24, relative_attention_num_buckets=8,
    relative_attention_max_distance=16, feed_forward_proj="gated-gelu", dropout_rate=0.0,
    layer_norm_epsilon=1e-6, is_decoder=False,
)  # fmt: skip


def torch_t5_block():
    """TORCH_FACTORY: transformers' T5Block (encoder, relative attention bias), a batch of 2
    sequences of 12 with the last three positions of one masked (additive mask, as T5Stack's)."""
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Block

    cfg = T5Config(**T5, attn_implementation="eager")
    block = _randomize(T5Block(cfg, has_relative_attention_bias=True), 0)
    x = torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, 1, 1, 12)
    mask[1, ..., -3:] = torch.finfo(torch.float32).min
    return block, (x, mask)


def nnx_t5_block(torch_module, **kw):
    port = zoo_ports.T5Block(
        torch_module.layer[0].SelfAttention.config,
        param_dtype=param_dtype(torch_module),
        rngs=nnx.Rngs(0),
        **kw,
    )
    return load_torch(port, torch_module)


def nnx_t5_block_erf_gelu(torch_module):
    """Wrong on purpose: the erf GELU where T5's "gated-gelu" is transformers' gelu_new (tanh)."""
    return nnx_t5_block(torch_module, tanh_gelu=False)


# ---------------------------------------------------------------------------------------- Qwen2

QWEN2 = dict(
    vocab_size=32, hidden_size=32, intermediate_size=48, num_attention_heads=4,
    num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=32, rope_theta=1e6,
    rms_norm_eps=1e-6,
)  # fmt: skip


def torch_qwen2_model():
    """TORCH_FACTORY: transformers' Qwen2Model, two layers (q/k/v biases, grouped-query attention
    4 / 2 heads, rope theta 1e6, eager attention), random weights; two sequences of 8 token ids,
    the second padded at its last two (attention_mask 1 / 0), no cache."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Model

    model = _randomize(Qwen2Model(Qwen2Config(**QWEN2, attn_implementation="eager")), 0)
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, -2:] = 0
    return model, (), {"input_ids": ids, "attention_mask": mask, "use_cache": False}


def nnx_qwen2_model(torch_module):
    port = zoo_ports.Qwen2Model(
        torch_module.config, param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0)
    )
    return load_torch(port, torch_module)


# -------------------------------------------------------------------------------------- Whisper

WHISPER = dict(
    d_model=32, encoder_attention_heads=4, encoder_ffn_dim=48, activation_function="gelu",
    dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
)  # fmt: skip


def torch_whisper_layer(dtype=torch.float32):
    """TORCH_FACTORY: transformers' WhisperEncoderLayer (d_model 32, 4 heads, exact GELU, eager
    attention), random weights; (2, 10, 32) hidden states and an additive padding mask (the last
    three keys of the second sequence), built in the run's dtype."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoderLayer

    layer = _randomize(
        WhisperEncoderLayer(WhisperConfig(**WHISPER, attn_implementation="eager")), 0
    )
    x = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, 1, 10, 10, dtype=dtype)
    mask[1, ..., -3:] = torch.finfo(dtype).min
    return layer, (x, mask)


def nnx_whisper_layer(torch_module):
    cfg = torch_module.self_attn.config
    port = zoo_ports.WhisperEncoderLayer(
        cfg, param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0)
    )
    return load_torch(port, torch_module)


# ------------------------------------------------------------------------------------------ SAM


def torch_sam_block():
    """TORCH_FACTORY: segment-anything's image-encoder Block (dim 16, 2 heads, window 4 on a 6x6
    map: padded to 8x8, four windows; relative positions; LayerNorm eps 1e-6 as SAM builds it)."""
    from functools import partial

    block = sam_modeling().image_encoder.Block(
        16, 2, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), use_rel_pos=True,
        window_size=4, input_size=(6, 6),
    )  # fmt: skip
    x = torch.randn(2, 6, 6, 16, generator=torch.Generator().manual_seed(1))
    return _randomize(block, 0), (x,)


def nnx_sam_block(torch_module, **kw):
    port = zoo_ports.SamBlock(
        16, 2, 4, param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0), **kw
    )
    return load_torch(port, torch_module)


def nnx_sam_block_swapped_rel_pos(torch_module):
    """Wrong on purpose: the height table of relative positions along the width and back."""
    return nnx_sam_block(torch_module, swap_rel_pos=True)


class TorchUpscaling(torch.nn.Module):
    """MaskDecoder.output_upscaling of a real segment-anything MaskDecoder (transformer_dim 32)."""

    def __init__(self):
        super().__init__()
        modeling = sam_modeling()
        transformer = modeling.TwoWayTransformer(depth=1, embedding_dim=32, num_heads=2, mlp_dim=64)
        self.output_upscaling = modeling.MaskDecoder(
            transformer_dim=32, transformer=transformer
        ).output_upscaling

    def forward(self, x):
        return self.output_upscaling(x)


def torch_sam_upscaling():
    """TORCH_FACTORY: the upscaling path on a (2, 32, 4, 4) image embedding -> (2, 4, 16, 16)."""
    torch.manual_seed(0)
    x = torch.randn(2, 32, 4, 4, generator=torch.Generator().manual_seed(1))
    return _randomize(TorchUpscaling(), 0), (x,)


def nnx_sam_upscaling(torch_module, **kw):
    port = zoo_ports.Upscaling(32, param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0), **kw)
    return load_torch(port, torch_module)


def nnx_sam_upscaling_eps_1e_5(torch_module):
    """Wrong on purpose: LayerNorm2d with nn.LayerNorm's eps 1e-5 (SAM's is 1e-6)."""
    return nnx_sam_upscaling(torch_module, eps=1e-5)


# -------------------------------------------------------------------------------------- EnCodec


def torch_encodec_lstm():
    """TORCH_FACTORY: transformers' EncodecLSTM (2 layers, dimension 12) on (2, 12, 10) maps."""
    from transformers import EncodecConfig
    from transformers.models.encodec.modeling_encodec import EncodecLSTM

    module = EncodecLSTM(EncodecConfig(num_lstm_layers=2), 12)
    x = torch.randn(2, 12, 10, generator=torch.Generator().manual_seed(1))
    return _randomize(module, 0), (x,)


def nnx_encodec_lstm(torch_module):
    port = zoo_ports.EncodecLSTM(12, 2, param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0))
    return load_torch(port, torch_module)


def nnx_encodec_lstm_tf_gate_order(torch_module):
    """Wrong on purpose: the first layer's gates read in TensorFlow's i, c, f, o order (torch's
    is i, f, g, o): its f and g slices swapped."""
    port = nnx_encodec_lstm(torch_module)
    cell = port.lstm.layers[0].cell
    for lin in (cell.dense_i, cell.dense_h):
        for var in (lin.kernel, lin.bias):
            i, f, g, o = (var[..., k * 12 : (k + 1) * 12] for k in range(4))
            var[...] = _cat(i, g, f, o)
    return port


def _cat(*parts):
    import jax.numpy as jnp

    return jnp.concatenate(parts, axis=-1)


PORTS = {
    "qwen2_model": (torch_qwen2_model, nnx_qwen2_model),
    "whisper_layer": (torch_whisper_layer, nnx_whisper_layer),
    "t5_block": (torch_t5_block, nnx_t5_block),
    "sam_block": (torch_sam_block, nnx_sam_block),
    "sam_upscaling": (torch_sam_upscaling, nnx_sam_upscaling),
    "encodec_lstm": (torch_encodec_lstm, nnx_encodec_lstm),
}
WRONG = {
    "t5_block": (nnx_t5_block_erf_gelu, "float32", "layer.1.DenseReluDense"),
    "sam_block": (nnx_sam_block_swapped_rel_pos, "float32", "attn"),
    "sam_upscaling": (nnx_sam_upscaling_eps_1e_5, "float64", "output_upscaling.1"),
    "encodec_lstm": (nnx_encodec_lstm_tf_gate_order, "float32", "lstm"),
}


# the ports run in bf16 too (pure bf16 on both sides, parity/diff.py): transformers' modules
BFLOAT16_PORTS = ("qwen2_model", "t5_block", "whisper_layer")


@pytest.mark.parametrize(
    "name, dtype",
    [
        *((name, dtype) for name in sorted(PORTS) for dtype in ("float64", "float32")),
        *((name, "bfloat16") for name in BFLOAT16_PORTS),
    ],
)
def test_port_agrees_with_gradients(name, dtype):
    report = diff(*PORTS[name], dtype=dtype, grads=True)
    assert report.passed, format_report(report)
    assert report.section("grads") and all(r.passed for r in report.section("grads"))


def test_t5_float64_needs_its_float32_casts_promoted():
    """T5LayerNorm takes its mean of squares in float32 (`.to(torch.float32)`): run as written
    in a float64 run, the block agrees only to float32 round-off, at its first norm; promoted
    (the default), within FLOAT64 (test_port_agrees_with_gradients)."""
    report = diff(*PORTS["t5_block"], dtype="float64", keep_casts=True)
    module, row = report.first_divergent()
    assert module == "layer.0.layer_norm" and row.inputs_agree, format_report(report)
    assert 1e-8 < row.comparison.scale_rel < 1e-6, format_report(report)


@pytest.mark.parametrize("name", ["encodec_lstm", "sam_block", "sam_upscaling", "t5_block"])
def test_three_adamw_steps_match_torch(name, x64):
    """float64 (FLOAT64), T5's float32 casts promoted to float64 as the diff does."""
    torch_factory, nnx_factory = PORTS[name]
    module, args = torch_factory()
    module = module.double()
    args = tuple(a.double() if a.is_floating_point() else a for a in args)
    # SAM's key bias has an exactly-zero gradient that Adam turns into round-off steps: judged by
    # torch's own one-ulp envelope
    # (docs/porting_your_model.md, "Adam turns a zero gradient's round-off into a step")
    seeds = (1, 2) if name == "sam_block" else ()
    with promoted_casts(module):
        report = compare_steps(
            module, nnx_factory(module), args, AdamW(lr=1e-2), steps=3, envelope_seeds=seeds
        )
    assert report.passed, format_report(report)


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_port_is_named(name):
    wrong, dtype, where = WRONG[name]
    report = diff(PORTS[name][0], wrong, dtype=dtype)
    module, row = report.first_divergent()
    assert module == where, format_report(report)


# -------------------------------------------------------------------------------- mutation tables

CAST = "tests.zoo_ports:at_least_float32"
# An RMSNorm whose float32 upcast is skipped, in a bf16 run; float32 and float64 runs never see it
NORM_IN_BF16 = (
    "no dtype catches it: float32 and float64 runs cast to what they have, and in bf16 the norm"
    " computed in bf16 moves its output by about one bf16 rounding (3.7e-3 of scale in the"
    " Llama layer), inside BFLOAT16"
)


_NO_CAUSAL = "an encoder: no causal mask"


def llama_layer_mutants() -> Spec:
    from tests.test_parity_llama import nnx_llama_layer, torch_llama_layer

    return Spec(
        "Llama decoder layer",
        torch_llama_layer,
        nnx_llama_layer,
        [
            Mutant("transpose_output", ""),
            Mutant("permute_axes", "self_attn", option=(1, (0, 2, 3, 1))),  # (B, T, S, heads)
            Mutant("drop_position", ""),
            Mutant("permute_heads", "self_attn.q_proj", option=(4, 0, 32)),
            Mutant("eps_x10", "post_attention_layernorm", "float64"),
            Mutant(
                "swap_weights",
                "",
                names="mlp.gate_proj",
                option=(("mlp.gate_proj.kernel", None), ("mlp.up_proj.kernel", None)),
            ),
            Mutant("drop_residual", ""),
            Mutant("skip_cast", "input_layernorm", "bfloat16", option=CAST, finding=NORM_IN_BF16),
        ],
        {
            "drop_bias": "no biases (attention_bias and mlp_bias off, as Llama's)",
            "other_gelu": "SwiGLU (SiLU): no GELU",
            "rope_theta": "the rotary tables are an input: a layer alone cannot check theta "
            "(the Qwen2 model's rotary_emb row does)",
            "causal_off_by_one": "the mask is an input",
        },
    )


def qwen2_model_mutants() -> Spec:
    return Spec(
        "Qwen2 model (2 layers, rotary_emb)",
        torch_qwen2_model,
        nnx_qwen2_model,
        [
            Mutant("transpose_output", ""),
            Mutant("permute_axes", "layers.0.self_attn", option=(1, (0, 2, 3, 1))),
            Mutant("drop_position", ""),
            Mutant("permute_heads", "layers.0.self_attn.q_proj", option=(4, 0, 32)),
            Mutant("drop_bias", "layers.0.self_attn.q_proj"),
            Mutant("eps_x10", "layers.1.post_attention_layernorm", "float64"),
            Mutant(
                "swap_weights",
                "",
                names="layers.0.mlp.gate_proj",
                option=(
                    ("layers.0.mlp.gate_proj.kernel", None),
                    ("layers.0.mlp.up_proj.kernel", None),
                ),
            ),
            Mutant("rope_theta", "rotary_emb"),
            Mutant("causal_off_by_one", ""),  # the model builds its mask
            Mutant("drop_residual", "layers.0"),
            Mutant(
                "skip_cast",
                "layers.0.input_layernorm",
                "bfloat16",
                option=CAST,
                finding=NORM_IN_BF16,
            ),
        ],
        {"other_gelu": "SwiGLU (SiLU): no GELU"},
    )


def whisper_layer_mutants() -> Spec:
    return Spec(
        "Whisper encoder layer",
        torch_whisper_layer,
        nnx_whisper_layer,
        [
            Mutant("transpose_output", ""),
            Mutant("permute_axes", "self_attn", option=(1, (0, 2, 3, 1))),
            Mutant("drop_position", ""),
            Mutant("permute_heads", "self_attn.q_proj", option=(4, 0, 32)),
            Mutant("drop_bias", "self_attn.q_proj"),
            Mutant("eps_x10", "final_layer_norm", "float64"),
            Mutant(
                "swap_weights",
                "",
                names="self_attn.v_proj",  # the first of the two in state_dict order
                option=(("self_attn.q_proj.kernel", None), ("self_attn.v_proj.kernel", None)),
            ),
            Mutant("other_gelu", "activation_fn"),
            Mutant("drop_residual", ""),
        ],
        {
            "rope_theta": "sinusoidal positions, added before the layers",
            "causal_off_by_one": _NO_CAUSAL,
            "skip_cast": "no cast to skip: Whisper's eager softmax runs in the input's dtype",
        },
    )


def t5_block_mutants() -> Spec:
    return Spec(
        "T5 block",
        torch_t5_block,
        nnx_t5_block,
        [
            Mutant("transpose_output", ""),
            Mutant("permute_axes", "layer.0.SelfAttention", option=(2, (0, 2, 3, 1))),
            Mutant("drop_position", ""),
            Mutant("permute_heads", "layer.0.SelfAttention.q", option=(4, 0, 16)),
            Mutant("eps_x10", "layer.1.layer_norm", "float64"),
            Mutant(
                "swap_weights",
                "",
                names="layer.1.DenseReluDense.wi_0",
                option=(
                    ("layer.1.DenseReluDense.wi_0.kernel", None),
                    ("layer.1.DenseReluDense.wi_1.kernel", None),
                ),
            ),
            Mutant("other_gelu", "layer.1.DenseReluDense"),
            Mutant("drop_residual", ""),
            Mutant(
                "skip_cast", "layer.0.layer_norm", "bfloat16", option=CAST, finding=NORM_IN_BF16
            ),
        ],
        {
            "drop_bias": "no biases in T5",
            "rope_theta": "relative position buckets: no rotary embedding",
            "causal_off_by_one": _NO_CAUSAL,
        },
    )


def sam_block_mutants() -> Spec:
    return Spec(
        "SAM image-encoder block",
        torch_sam_block,
        nnx_sam_block,
        [
            Mutant("transpose_output", ""),
            Mutant("drop_position", ""),
            Mutant("permute_heads", "attn.qkv", option=(2, 0, 16)),  # the query third
            Mutant("drop_bias", "attn.proj"),
            Mutant("eps_x10", "norm2", "float64"),
            Mutant(
                "swap_weights",
                "",
                names="norm1",
                option=(("norm1.scale", None), ("norm2.scale", None)),
            ),
            Mutant("other_gelu", "mlp"),
            Mutant("drop_residual", ""),
        ],
        {
            "permute_axes": "its attention returns no weights; the (B, H, W, C) output's order: "
            "transpose_output",
            "rope_theta": "decomposed relative positions: no rotary embedding",
            "causal_off_by_one": _NO_CAUSAL,
            "skip_cast": "no casts",
        },
    )


MUTANTS = {
    "llama_layer": llama_layer_mutants,
    "qwen2_model": qwen2_model_mutants,
    "whisper_layer": whisper_layer_mutants,
    "t5_block": t5_block_mutants,
    "sam_block": sam_block_mutants,
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_every_mutant_is_killed_and_named(name):
    """Each table's unmutated port passes in every dtype it uses; each mutant fails in its
    row's dtype and the report names the module its row names; the rows with a finding (a
    float32 upcast skipped in a bf16 run) survive as written."""
    result = mutate.run(MUTANTS[name]())
    text = mutate.format_result(result)
    assert result.passed, text
    findings = [o for o in result.outcomes if o.mutant.finding]
    assert result.killed == len(result.outcomes) - len(findings), text


WHISPER_LAYOUTS = {
    "transposed": (Mutant("transpose_output", ""), "", "port shape (2, 32, 10), torch (2, 10, 32)"),
    "weights (B, T, S, H)": (
        Mutant("permute_axes", "self_attn", option=(1, (0, 2, 3, 1))),
        "self_attn",
        "out[1]: port shape (2, 10, 10, 4), torch (2, 4, 10, 10)",
    ),
    "position dropped": (
        Mutant("drop_position", ""),
        "",
        "port shape (2, 9, 32), torch (2, 10, 32)",
    ),
}


@pytest.mark.parametrize("grads", [False, True], ids=["outputs", "grads"])
@pytest.mark.parametrize("case", sorted(WHISPER_LAYOUTS))
def test_a_whisper_layer_in_another_layout_fails_naming_its_module(case, grads):
    """Whisper's encoder layer returning (B, D, T), its attention weights as (B, T, S, H), or
    one position short: the row of that module fails, naming both shapes, with and without
    gradients (with them, the outputs still fail first)."""
    mutant, module, shapes = WHISPER_LAYOUTS[case]
    wrong = mutate.mutated_factory(nnx_whisper_layer, mutant)
    report = diff(torch_whisper_layer, wrong, grads=grads)
    found, row = report.first_divergent()
    assert found == module and row.section == "outputs", format_report(report)
    assert shapes in row.note and "no layout declared for this module" in row.note, row.note
