"""The toolkit on modules of real models no one here wrote, built from the installed PyPI packages
with random weights, offline (the `zoo` extra: transformers, segment-anything; skipped with a
reason without it): transformers' T5 encoder block (relative attention bias, T5's RMS norm, the
gated-GELU feed-forward), segment-anything's image-encoder block (windowed attention, decomposed
relative positions) and its mask decoder's upscaling path (ConvTranspose2d + LayerNorm2d), and
transformers' EnCodec LSTM (two layers). Each port (tests/zoo_ports.py): weights EXACT, every
module's output and every gradient within FLOAT64 (T5's own float32 casts run in float64, as the
diff runs them: parity/promote.py) and FLOAT32, three AdamW steps within FLOAT64, and one wrong
port that the diff names. Slow tier (`make test-slow` installs the extra); by hand:

    python -m parity diff tests.test_parity_zoo:torch_t5_block tests.test_parity_zoo:nnx_t5_block
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

pytestmark = pytest.mark.slow  # ~20 diffs and step runs of four real models' modules

from parity.check import format_report  # noqa: E402
from parity.diff import diff  # noqa: E402
from parity.keymap import load_torch, param_dtype  # noqa: E402
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


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(PORTS))
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


@pytest.mark.parametrize("name", sorted(PORTS))
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
