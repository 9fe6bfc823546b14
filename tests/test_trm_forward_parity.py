"""One ACT step, module by module: NNX port vs our torch reference (parity/trm_torch) with the same
weights. Every captured tensor (input embedding, puzzle prefix, every block of every L and H cycle,
the latents, logits, q logits) is compared under a named bound; a failure names the tensor.

float64: port vs torch directly (FLOAT64). float32 and bfloat16: torch's own round-off through the
recursion is as large as a direct bound (float32: torch vs torch-in-float64 up to 2.1e-5 of scale
on one block output), so the port and torch in that dtype are both measured against torch in
float64 and the port may be no further from it than torch itself plus a margin (ReferenceBound,
parity/compare.py). Eager (op-by-op, like torch) and jitted (one XLA program, as in training).
"""

import pytest

pytest.importorskip("torch")

from parity.compare import (  # noqa: E402
    AS_TORCH_BFLOAT16,
    AS_TORCH_FLOAT32,
    BFLOAT16,
    FLOAT64,
)
from parity.trm_fixtures import (  # noqa: E402
    VARIANTS,
    make_batch,
    make_pair,
    one_step_comparisons,
    reference_comparisons,
    tiny_config,
)


def _pair(cfg, seed=0):
    head, model = make_pair(cfg, seed)
    head.eval()
    model.eval()
    return head, model


def _check(cfg, tol, seed=0, *, names=None, jit=False):
    head, model = _pair(cfg, seed)
    rows = one_step_comparisons(head, model, make_batch(cfg, seed), tol, jit=jit)
    checked = [r for r in rows if names is None or r.name in names]
    bad = [r.message() for r in checked if not r.passed]
    assert not bad, "\n".join(bad)
    return rows


def _check_vs_float64(cfg, bound, seed=0, *, jit=False):
    head, model = _pair(cfg, seed)
    rows = reference_comparisons(head, model, make_batch(cfg, seed), bound, jit=jit)
    bad = [r.message() for r in rows if not r.passed]
    assert not bad, f"{len(bad)} of {len(rows)} tensors:\n" + "\n".join(bad)
    return rows


@pytest.mark.parametrize("variant", ["mlp_t", "att", "learned"])
def test_one_step_float32(variant):
    cfg = tiny_config(variant, "float32")
    rows = _check_vs_float64(cfg, AS_TORCH_FLOAT32)
    # the capture holds every block call: H_cycles * (L_cycles + 1) * L_layers for TRM
    n_blocks = sum(".layers." in r.name for r in rows)
    assert n_blocks == cfg.H_cycles * (cfg.L_cycles + 1) * cfg.L_layers


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_step_float32_jitted(variant):
    # the step as training runs it: one XLA program (fusion and reduction order differ from eager)
    _check_vs_float64(tiny_config(variant, "float32"), AS_TORCH_FLOAT32, jit=True)


@pytest.mark.parametrize("variant", ["mlp_t", "att"])
def test_one_step_float64(variant, x64):
    _check(tiny_config(variant, "float64"), FLOAT64)


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_step_float64_jitted(variant, x64):
    _check(tiny_config(variant, "float64"), FLOAT64, jit=True)


def test_one_step_bfloat16_mlp_t():
    # Every op rounds like torch (silu rounded once, addmm bias before rounding): logits and q match
    # within BFLOAT16 (measured: bit-identical on this config).
    _check(tiny_config("mlp_t", "bfloat16"), BFLOAT16, names=("logits", "q_logits"))


def test_one_step_bfloat16_attention():
    # torch's CPU SDPA kernel uses a vectorised approximate exp: 1-ulp bf16 flips per attention
    # call that compound over recursion (measured 2 bf16 ulps on logits at H2/L2, docs). One cycle
    # of one L step keeps the claim within BFLOAT16.
    cfg = tiny_config("att", "bfloat16", H_cycles=1, L_cycles=1)
    _check(cfg, BFLOAT16, names=("logits", "q_logits"))


@pytest.mark.parametrize("variant", ["hrm", "singlez", "hier6", "baseline"])
def test_variants_one_step_float64(variant, x64):
    _check(tiny_config(variant, "float64"), FLOAT64)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["hrm", "singlez", "hier6", "baseline"])
def test_variants_one_step_float32(variant):
    _check_vs_float64(tiny_config(variant, "float32"), AS_TORCH_FLOAT32)


@pytest.mark.parametrize(
    "variant, jit",  # eager for hrm / singlez / hier6 / baseline in the slow tier (~7 s each)
    [
        pytest.param(
            v,
            jit,
            id=f"{v}-{'jitted' if jit else 'eager'}",
            marks=[pytest.mark.slow] if not jit and v not in ("mlp_t", "att", "learned") else [],
        )
        for jit in (False, True)
        for v in VARIANTS
    ],
)
def test_one_step_bfloat16_as_torch(variant, jit):
    # The default depth (H2/L2), every captured tensor: the port in bf16 is no further from the
    # float64 value than torch in bf16 is, within AS_TORCH_BFLOAT16's factor.
    _check_vs_float64(tiny_config(variant, "bfloat16"), AS_TORCH_BFLOAT16, jit=jit)


def test_mlp_t_norm_is_over_tokens():
    """Catches a port that normalises the mlp_t branch over the hidden axis instead of tokens."""
    import jax.numpy as jnp
    import numpy as np

    from models.trm.layers import rms_norm

    cfg = tiny_config("mlp_t", "float32")
    _, model = make_pair(cfg)
    block = model.inner.L_level.layers[0]
    h = jnp.asarray(
        np.random.default_rng(0).standard_normal((2, cfg.total_len, cfg.hidden_size)), jnp.float32
    )
    t = jnp.swapaxes(h, 1, 2)
    after_t = jnp.swapaxes(rms_norm(t + block.mlp_t(t), cfg.rms_norm_eps), 1, 2)
    expected = rms_norm(after_t + block.mlp(after_t), cfg.rms_norm_eps)
    np.testing.assert_array_equal(np.asarray(block(None, h)), np.asarray(expected))
    # and its RMS over tokens (axis 1) is 1 before the channel MLP
    assert np.allclose(np.sqrt(np.mean(np.square(np.asarray(after_t)), axis=1)), 1.0, atol=1e-3)


@pytest.mark.parametrize("variant", ["att", "mlp_t"])
def test_no_puzzle_embedding_float64(variant, x64):
    """puzzle_emb_ndim=0 with puzzle_emb_len=4: no prefix is prepended, so `prefix_len` is 0 and
    every shape counts seq_len positions (upstream keeps counting puzzle_emb_len rows and crashes
    on 97 vs 81 in Sudoku). Reverting `TRMConfig.prefix_len` to puzzle_emb_len breaks both sides
    (RoPE/learned tables and the mlp_t width for 20 positions, 16 given)."""
    cfg = tiny_config(variant, "float64", puzzle_emb_ndim=0)
    assert cfg.puzzle_emb_len == 4 and cfg.prefix_len == 0 and cfg.total_len == cfg.seq_len
    head, model = make_pair(cfg)
    assert not any("puzzle_emb" in k for k in head.state_dict())
    assert not hasattr(model.inner, "puzzle_emb")
    rows = _check(cfg, FLOAT64)
    shapes = {r.name: r.shape for r in rows}
    b, s, d = cfg.batch_size, cfg.seq_len, cfg.hidden_size
    assert shapes["input_embedding"] == (b, s, d) and shapes["puzzle_prefix"] == (b, 0, d)
    assert shapes["z_H"] == shapes["z_L"] == (b, s, d)
    assert shapes["logits"] == (b, s, cfg.vocab_size) and shapes["q_logits"] == (b, 2)


def _port_shapes(cfg):
    """The port's state_dict key -> shape, from nnx.eval_shape (no arrays allocated)."""
    from flax import nnx

    from models.trm import TRM

    abstract = nnx.eval_shape(lambda: TRM(cfg, rngs=nnx.Rngs(0)))
    return {
        "model.inner." + ".".join(map(str, path)): tuple(var.shape)
        for path, var in nnx.iter_graph(abstract.inner)
        if isinstance(var, nnx.Variable) and not isinstance(var, nnx.RngState)
    }


def _baseline_attention_shapes(state_dict_shapes, prefix="model.inner.H_level.layers.0"):
    return (
        tuple(state_dict_shapes[f"{prefix}.self_attn.qkv_proj.weight"]),
        tuple(state_dict_shapes[f"{prefix}.self_attn.o_proj.weight"]),
    )


def test_baseline_heads_not_dividing_hidden_float64(x64):
    """transformers_baseline with num_heads not dividing hidden_size runs as upstream's yaml does
    (12 heads on 512): head_dim = hidden // heads, attention width heads * head_dim < hidden.
    Here 6 heads on 64: head_dim 10, width 60, through the same Attention code as 42 x 12 = 504.
    Forward parity against the torch reference, and the shapes on both sides. Reverting the
    decision (rounding head_dim up, or refusing the config) fails here."""
    cfg = tiny_config("baseline", "float64", num_heads=6)
    assert cfg.head_dim == 10 and cfg.num_heads * cfg.head_dim == 60 != cfg.hidden_size
    head, model = make_pair(cfg)
    torch_shapes = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert _baseline_attention_shapes(torch_shapes) == ((180, 64), (64, 60))
    assert _baseline_attention_shapes(_port_shapes(cfg)) == ((180, 64), (64, 60))
    _check(cfg, FLOAT64)


def test_baseline_upstream_yaml_shapes_on_both_sides():
    """The real size (hidden 512, 12 heads, H_layers 8): qkv_proj (1512, 512), o_proj (512, 504)
    in the port (nnx.eval_shape) and in the torch reference (built on the meta device), and every
    other key and shape agree. No arrays are allocated."""
    import torch

    from models.trm import TRMConfig
    from parity.trm_torch import ACTLossHead, build_model

    cfg = TRMConfig(
        arch="transformers_baseline", H_layers=8, num_heads=12, hidden_size=512,
        batch_size=768, seq_len=81, vocab_size=11, puzzle_emb_ndim=512,
    )  # fmt: skip
    assert cfg.head_dim == 42
    ours = _port_shapes(cfg)
    with torch.device("meta"):
        ref = {k: tuple(v.shape) for k, v in ACTLossHead(build_model(cfg)).state_dict().items()}
    assert _baseline_attention_shapes(ours) == ((1512, 512), (512, 504))
    assert ours == ref


def test_baseline_ignores_mlp_t_float64(x64):
    """Upstream's transformers_baseline has no mlp_t (its config has no such field, its block
    only attention); our reference builds attention blocks whatever mlp_t says, and so must the
    port (`TRMConfig.block_mlp_t`). With mlp_t=True: the same state_dict keys as with
    mlp_t=False, parity with the reference, and the same outputs as mlp_t=False bit for bit.
    Reverting (the NNX Block honouring mlp_t) builds `mlp_t` modules the reference's state_dict
    lacks: from_torch raises StateDictError."""
    import dataclasses

    import numpy as np

    cfg = tiny_config("baseline", "float64", mlp_t=True)
    plain = dataclasses.replace(cfg, mlp_t=False)
    assert not cfg.block_mlp_t
    head, model = make_pair(cfg)
    assert set(head.state_dict()) == set(_port_shapes(cfg)) == set(_port_shapes(plain))
    assert not any(".mlp_t." in k for k in _port_shapes(cfg))
    _check(cfg, FLOAT64)
    _, plain_model = make_pair(plain)
    for m in (model, plain_model):
        m.eval()
    batch = make_batch(cfg)
    from parity.trm_fixtures import jax_one_step

    got = dict(jax_one_step(model, batch))
    want = dict(jax_one_step(plain_model, batch))
    for name in ("logits", "q_logits", "z_H"):
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)


def test_reference_bounds_catch_a_wrong_port(monkeypatch):
    """The float32 and bf16 bounds are relative to torch's own error; they must still see a wrong
    port. float32: one weight element off by 1e-3 (every tensor from the changed block on fails,
    by 35x on its first output). bf16, where torch's own error is 1-3% rms: one weight matrix 10%
    off fails on the logits (measured 2.1x the limit), a block without its attention residual
    fails from its first output on (measured 75x on the logits)."""
    from models.trm import layers, modeling

    def failing(cfg, bound, wrong):
        head, model = _pair(cfg)
        wrong(model)
        rows = reference_comparisons(head, model, make_batch(cfg), bound)
        failed = [r.name for r in rows if not r.passed]
        assert "logits" in failed, "\n".join(r.message() for r in rows)
        return failed

    def nudge_one_element(model):
        w = model.inner.L_level.layers[1].mlp.down_proj.weight
        w[...] = w[...].at[0, 0].add(1e-3)

    def scale_matrix(model):
        w = model.inner.L_level.layers[1].mlp.down_proj.weight
        w[...] = w[...] * 1.1

    f32 = tiny_config("att", "float32")
    assert failing(f32, AS_TORCH_FLOAT32, nudge_one_element)[0] == "L_level.layers.1 [1/6]"
    bf16 = tiny_config("att", "bfloat16")
    failing(bf16, AS_TORCH_BFLOAT16, scale_matrix)

    def no_attention_residual(self, cos_sin, h_bld):
        h_bld = layers.rms_norm(self.self_attn(cos_sin=cos_sin, hidden_states=h_bld), self.norm_eps)
        return layers.rms_norm(h_bld + self.mlp(h_bld), self.norm_eps)

    monkeypatch.setattr(modeling.Block, "_forward", no_attention_residual)
    failed = failing(bf16, AS_TORCH_BFLOAT16, lambda model: None)
    assert failed[0] == "L_level.layers.0 [1/6]"


def test_parity_report_cli_bfloat16_jitted(capsys):
    from parity.report_trm import main

    assert main(["--variant", "att", "--dtype", "bfloat16", "--jit"]) == 0
    out = capsys.readouterr().out
    assert "jitted" in out and "as-torch" not in out and "limit = 3 x torch err" in out
    assert "logits" in out and "0 failed" in out
