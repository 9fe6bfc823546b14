"""transformers' LlamaDecoderLayer, unmodified (RMSNorm, rotary tables, grouped-query attention,
SwiGLU; eager attention), from a tiny random LlamaConfig, against its NNX port
(tests/zoo_ports.py::LlamaDecoderLayer): the worked example of docs/porting_your_model.md,
"Recipe: a transformer layer (transformers' LlamaDecoderLayer)". The layer takes keyword inputs
and a nested (cos, sin) pair, as LlamaModel calls it. Slow tier, with the `zoo` extra (skipped with a reason without it); by hand:

    python -m parity diff tests.test_parity_llama:torch_llama_layer \
        tests.test_parity_llama:nnx_llama_layer --dtype float64 --grads
"""

from __future__ import annotations

import pytest
from flax import nnx

torch = pytest.importorskip("torch")
pytest.importorskip(
    "transformers",
    reason="transformers needs the zoo extra (make test-slow installs it; or pip install -e '.[zoo]')",
)

pytestmark = pytest.mark.slow  # a dozen diffs of a real decoder layer, a few seconds each

from parity.check import format_report  # noqa: E402
from parity.diff import diff  # noqa: E402
from parity.keymap import load_torch, param_dtype  # noqa: E402
from tests import zoo_ports  # noqa: E402

LLAMA = dict(
    vocab_size=32, hidden_size=32, intermediate_size=48, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5, rope_theta=500.0,
)  # fmt: skip
BATCH, SEQ = 2, 8


def torch_llama_layer(dtype=torch.float32):
    """TORCH_FACTORY: LlamaDecoderLayer with seeded normal weights (norm scales too), a batch of
    two sequences of 8, the second padded at its last two positions; keyword inputs as
    LlamaModel passes them: the rotary tables from transformers' own LlamaRotaryEmbedding and
    an additive causal + padding mask, both built in the run's dtype."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(**LLAMA, attn_implementation="eager")
    layer = LlamaDecoderLayer(cfg, layer_idx=0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
    x = torch.randn(BATCH, SEQ, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    position_ids = torch.arange(SEQ).expand(BATCH, SEQ)
    cos, sin = LlamaRotaryEmbedding(cfg)(x.to(dtype), position_ids)
    # 0 where a query sees a key, the dtype's most negative number where it does not
    never = torch.finfo(dtype).min
    mask = torch.full((SEQ, SEQ), never, dtype=dtype).triu(1).expand(BATCH, 1, SEQ, SEQ).clone()
    mask[1, ..., -2:] = never
    return layer, (x,), {"attention_mask": mask, "position_embeddings": (cos, sin)}


def nnx_llama_layer(torch_module, **kw):
    port = zoo_ports.LlamaDecoderLayer(
        torch_module.self_attn.config, param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0), **kw
    )
    return load_torch(port, torch_module)


def nnx_llama_layer_post_norm_eps_1e_6(torch_module):
    """Wrong on purpose: post_attention_layernorm with eps 1e-6 (the config's is 1e-5)."""
    return nnx_llama_layer(torch_module, post_norm_eps=1e-6)


def nnx_llama_layer_tiled_kv(torch_module):
    """Wrong on purpose: query head n reads key/value head n % 2 (jnp.tile) where transformers'
    repeat_kv gives it head n // 2."""
    return nnx_llama_layer(torch_module, tile_kv=True)


@pytest.mark.parametrize(
    "dtype, jit", [("float64", False), ("float64", True), ("float32", False), ("float32", True)]
)
def test_llama_layer_agrees_with_gradients(dtype, jit):
    report = diff(torch_llama_layer, nnx_llama_layer, dtype=dtype, grads=True, jit=jit)
    assert report.passed, format_report(report)
    grads = report.section("grads")
    assert len(grads) == 9 and all(r.passed for r in grads), format_report(report)
    compared = [r.module for r in report.section("outputs") if r.passed]
    for module in ("self_attn", "self_attn.q_proj", "mlp", "post_attention_layernorm", ""):
        assert module in compared, format_report(report)


def test_float64_runs_transformers_float32_casts_in_float64():
    """Promoted: the layer agrees within FLOAT64 and the note counts the casts where they are.
    As written (keep_casts): the first RMSNorm is float32-accurate and fails FLOAT64."""
    report = diff(torch_llama_layer, nnx_llama_layer, dtype="float64")
    assert report.passed, format_report(report)
    note = next(n for n in report.notes if "to float32 in torch ran in float64" in n)
    for where in ("input_layernorm 1", "self_attn 1", "post_attention_layernorm 1"):
        assert where in note, note
    kept = diff(torch_llama_layer, nnx_llama_layer, dtype="float64", keep_casts=True)
    module, row = kept.first_divergent()
    assert module == "input_layernorm" and row.inputs_agree, format_report(kept)
    assert 1e-8 < row.comparison.scale_rel < 1e-6, format_report(kept)  # float32 round-off


def test_wrong_rms_norm_eps_hides_in_float32_and_is_named_in_float64():
    wrong = nnx_llama_layer_post_norm_eps_1e_6
    hidden = diff(torch_llama_layer, wrong, dtype="float32")
    assert hidden.passed, format_report(hidden)
    report = diff(torch_llama_layer, wrong, dtype="float64")
    module, row = report.first_divergent()
    assert module == "post_attention_layernorm" and row.inputs_agree, format_report(report)


def test_tiled_kv_heads_are_named_at_the_attention():
    """The projections agree; o_proj's input (the attention's own code) is the first to differ,
    so the divergence is placed in self_attn."""
    report = diff(torch_llama_layer, nnx_llama_layer_tiled_kv, dtype="float32")
    module, row = report.first_divergent()
    assert module == "self_attn" and row.module == "self_attn.o_proj", format_report(report)


def test_bfloat16_casts_nested_inputs():
    """The (cos, sin) pair inside the keyword inputs is cast with the rest: the layer runs in
    bfloat16 on both sides and agrees within BFLOAT16 (or 3 x torch's own bf16 error)."""
    report = diff(torch_llama_layer, nnx_llama_layer, dtype="bfloat16", grads=True)
    assert report.passed, format_report(report)
