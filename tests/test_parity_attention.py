"""torch.nn.MultiheadAttention and torch.nn.TransformerEncoderLayer ported to Flax NNX with the
parity toolkit (tests/parity_ports.py): every weight EXACT, every module's output and every
parameter's gradient within FLOAT32 and FLOAT64, three Adam steps within FLOAT64, and a
deliberately wrong port of each that `python -m parity diff` names:

    python -m parity diff tests.test_parity_attention:torch_encoder_layer \
        tests.test_parity_attention:nnx_encoder_layer --grads
"""

from __future__ import annotations

import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from parity.check import format_report  # noqa: E402
from parity.diff import diff  # noqa: E402
from parity.keymap import load_torch, param_dtype  # noqa: E402
from parity.steps import Adam, compare_steps  # noqa: E402
from tests.parity_ports import MultiheadAttention, TransformerEncoderLayer  # noqa: E402

E, N, FF, B, T = 16, 4, 32, 2, 6


def _x():
    return torch.randn(B, T, E, generator=torch.Generator().manual_seed(1))


def _causal():
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # True: may not attend


def torch_mha():
    """TORCH_FACTORY: self-attention with a causal mask, attention weights returned."""
    torch.manual_seed(0)
    x = _x()
    return torch.nn.MultiheadAttention(E, N, batch_first=True), (x, x, x, None, True, _causal())


def nnx_mha(torch_module, **wrong):
    return load_torch(
        MultiheadAttention(E, N, param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0), **wrong),
        torch_module,
    )


def nnx_mha_head_minor(torch_module):
    """Wrong on purpose: heads split channel-minor (channel c in head c % N)."""
    return nnx_mha(torch_module, head_major=False)


def torch_encoder_layer(dropout: float = 0.1):
    """TORCH_FACTORY: a post-norm encoder layer on a causal mask."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(E, N, FF, dropout, batch_first=True)
    return layer, (_x(), _causal())


def nnx_encoder_layer(torch_module, **wrong):
    port = TransformerEncoderLayer(
        E, N, FF, torch_module.dropout.p, param_dtype=param_dtype(torch_module),
        rngs=nnx.Rngs(0), **wrong,
    )  # fmt: skip
    return load_torch(port, torch_module)


def nnx_encoder_layer_wrong_scale(torch_module):
    """Wrong on purpose: attention scores scaled by 1/sqrt(embed_dim), not 1/sqrt(head_dim)."""
    return nnx_encoder_layer(torch_module, attention=dict(scale_by_embed=True))


def nnx_encoder_layer_flax_eps(torch_module):
    """Wrong on purpose: norm2 with flax's default epsilon 1e-6."""
    return nnx_encoder_layer(torch_module, ln_eps=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "factories",
    [(torch_mha, nnx_mha), (torch_encoder_layer, nnx_encoder_layer)],
    ids=["MultiheadAttention", "TransformerEncoderLayer"],
)
def test_port_agrees_with_gradients(factories, dtype):
    report = diff(*factories, dtype=dtype, grads=True)
    assert report.passed, format_report(report)
    assert all(r.passed for r in report.section("grads"))
    assert report.section("grads")


def test_encoder_layer_compares_every_submodule():
    """Eight torch modules run in the layer (the attention's out_proj is read as a weight by
    torch, not called); each has a port output that agrees."""
    report = diff(torch_encoder_layer, nnx_encoder_layer, dtype="float64")
    labels = [r.label for r in report.section("outputs") if r.passed]
    assert labels == [
        "self_attn", "dropout1", "norm1", "linear1", "dropout", "linear2", "dropout2", "norm2",
        "(root)",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "factories",
    [(torch_mha, nnx_mha), (lambda: torch_encoder_layer(0.0), nnx_encoder_layer)],
    ids=["MultiheadAttention", "TransformerEncoderLayer"],
)
def test_three_adam_steps_match_torch_float64(factories, x64):
    """Every loss and every tensor after each of 3 Adam steps: FLOAT64, or 16x torch's own
    one-ulp envelope where that is wider (only the attention's key bias, below)."""
    module, args = _float64(*factories[0]())
    report = compare_steps(
        module, factories[1](module), args, Adam(lr=1e-2), steps=3, envelope_seeds=(1, 2)
    )
    assert report.passed, format_report(report)
    widened = {r.label.split()[-1] for r in report.rows if r.comparison.tolerance.name != "float64"}
    assert widened <= {"in_proj_bias", "self_attn.in_proj_bias"}, widened


def _float64(module, args):
    args = tuple(a.double() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)
    return module.double(), args


def test_adam_turns_the_key_bias_zero_gradient_into_noise(x64):
    """The key third of in_proj_bias has an exact gradient of 0 (softmax ignores a shift shared
    by every key); each side computes round-off instead, and Adam divides it by sqrt(v) + eps,
    so the step moves that bias by lr x noise / eps. After one step the port's key bias differs
    from torch's by ~1e-8 of the bias' scale, far over FLOAT64, while the query and value
    thirds and every other tensor agree within FLOAT64; torch's own run with its weights moved
    by one ulp moves the key bias by as much (the envelope the test above uses)."""
    module, args = _float64(*torch_mha())
    port = nnx_mha(module)
    report = compare_steps(module, port, args, Adam(lr=1e-2), steps=1)
    bad = [r.label for r in report.rows if r.passed is False]
    assert bad == ["step 1 in_proj_bias"], format_report(report)
    row = next(r for r in report.rows if r.passed is False)
    assert 16 <= row.comparison.worst_index[0] < 32  # the key third
    assert 1e-10 < row.comparison.scale_rel < 1e-6


def test_head_minor_split_is_named():
    report = diff(torch_mha, nnx_mha_head_minor, dtype="float32")
    assert report.first_divergent()[0] == "", format_report(report)


def test_wrong_softmax_scale_is_named_in_the_attention():
    report = diff(torch_encoder_layer, nnx_encoder_layer_wrong_scale, dtype="float32")
    module, row = report.first_divergent()
    assert module == "self_attn" and row.inputs_agree is True, format_report(report)


def test_flax_epsilon_in_norm2_is_named_in_float64():
    report = diff(torch_encoder_layer, nnx_encoder_layer_flax_eps, dtype="float64")
    module, row = report.first_divergent()
    assert module == "norm2" and row.inputs_agree is True, format_report(report)
