"""The cookbook's model (docs/porting_your_model.md): an embedding, a LayerNorm and a two-layer MLP
with dropout, in torch and ported to Flax NNX with the parity toolkit. Forward, gradients and Adam
steps equal torch's; two deliberately wrong ports are named by `python -m parity diff`.

The factories are the command's arguments:

    python -m parity diff tests.test_parity_mlp:torch_mlp tests.test_parity_mlp:nnx_mlp
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from parity.check import format_report  # noqa: E402
from parity.diff import diff  # noqa: E402
from parity.keymap import load_torch, param_dtype  # noqa: E402
from parity.steps import Adam, AdamW, compare_steps  # noqa: E402

VOCAB, DIM, HIDDEN = 50, 16, 64


class TorchMLP(torch.nn.Module):
    """ids -> Embedding -> LayerNorm -> x + fc2(dropout(gelu(fc1(x))))."""

    def __init__(self, p: float = 0.1):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.norm = torch.nn.LayerNorm(DIM)
        self.fc1 = torch.nn.Linear(DIM, HIDDEN)
        self.act = torch.nn.GELU()
        self.drop = torch.nn.Dropout(p)
        self.fc2 = torch.nn.Linear(HIDDEN, DIM)

    def forward(self, ids):
        x = self.norm(self.embed(ids))
        return x + self.fc2(self.drop(self.act(self.fc1(x))))


class MLP(nnx.Module):
    """The port: the same attribute names, so the state_dict maps by rule (parity.keymap)."""

    def __init__(
        self, p=0.1, *, eps=1e-5, approximate=False, param_dtype="float32", rngs: nnx.Rngs
    ):
        dt = dict(param_dtype=param_dtype)
        # nnx.Embed computes in the dtype it was built with: build it in the weights' dtype
        self.embed = nnx.Embed(VOCAB, DIM, rngs=rngs, **dt)
        # torch's LayerNorm: eps 1e-5 (flax's default is 1e-6) and the two-pass variance
        self.norm = nnx.LayerNorm(DIM, epsilon=eps, use_fast_variance=False, rngs=rngs, **dt)
        self.fc1 = nnx.Linear(DIM, HIDDEN, rngs=rngs, **dt)
        self.drop = nnx.Dropout(p, rngs=rngs)
        self.fc2 = nnx.Linear(HIDDEN, DIM, rngs=rngs, **dt)
        self.approximate = approximate

    def __call__(self, ids):
        x = self.norm(self.embed(ids))
        # torch.nn.GELU() is the exact erf form; jax.nn.gelu defaults to the tanh form
        h = jax.nn.gelu(self.fc1(x), approximate=self.approximate)
        return x + self.fc2(self.drop(h))


def torch_mlp():
    """TORCH_FACTORY: the module with seeded weights and one batch of token ids."""
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    return TorchMLP(), (ids,)


def nnx_mlp(torch_module, **kwargs):
    """NNX_FACTORY: the port, built in the torch weights' dtype, holding torch_module's weights."""
    port = MLP(param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0), **kwargs)
    return load_torch(port, torch_module)


def nnx_mlp_flax_eps(torch_module):
    """Wrong on purpose: flax's default LayerNorm epsilon (1e-6)."""
    return nnx_mlp(torch_module, eps=1e-6)


def nnx_mlp_tanh_gelu(torch_module):
    """Wrong on purpose: jax.nn.gelu's default tanh form."""
    return nnx_mlp(torch_module, approximate=True)


def nnx_mlp_float32_embed(torch_module):
    """Wrong on purpose: built with float32 parameters whatever torch's dtype (the weights are
    loaded in torch's dtype afterwards)."""
    return load_torch(MLP(rngs=nnx.Rngs(0)), torch_module)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_port_agrees_module_by_module_with_gradients(dtype):
    """Every weight EXACT, every module output and every parameter's gradient within FLOAT32 /
    FLOAT64, eval mode."""
    report = diff(torch_mlp, nnx_mlp, dtype=dtype, grads=True)
    assert report.passed, format_report(report)
    assert len(report.section("grads")) == 7  # embed, norm (2), fc1 (2), fc2 (2)
    compared = {r.label for r in report.section("outputs") if r.passed}
    assert compared == {"embed", "norm", "fc1", "drop", "fc2", "(root)"}


def test_flax_layernorm_epsilon_is_named_in_float64():
    """eps 1e-6 moves the normalised embeddings by 1.1e-5 of their scale: inside FLOAT32's bound
    (1e-5 x (|torch| + scale), so up to 2e-5 at the largest element), far over FLOAT64's. The
    float64 diff names `norm`, every row before it agrees; the float32 diff passes."""
    report = diff(torch_mlp, nnx_mlp_flax_eps, dtype="float64")
    module, row = report.first_divergent()
    assert module == "norm" and row.inputs_agree is True, format_report(report)
    assert diff(torch_mlp, nnx_mlp_flax_eps, dtype="float32").passed


def test_tanh_gelu_is_named_where_the_activation_runs():
    """The GELU is inline in the model's own forward (torch has it as a module `act`, the port as
    a function): the dropout after it is the first output that differs, but its inputs already
    differ, so the divergence is placed in the enclosing module, the model itself."""
    report = diff(torch_mlp, nnx_mlp_tanh_gelu, dtype="float32")
    module, row = report.first_divergent()
    assert row.label == "drop" and row.inputs_agree is False, format_report(report)
    assert module == "", format_report(report)
    assert "first divergent module: (root)" in format_report(report)


@pytest.mark.parametrize(
    "opt",
    [Adam(lr=1e-2), Adam(lr=1e-2, weight_decay=0.1), AdamW(lr=1e-2, weight_decay=0.1)],
    ids=["Adam", "Adam-L2", "AdamW"],
)
def test_three_optimizer_steps_match_torch_float64(opt, x64):
    """Three steps of torch.optim.Adam (with and without its L2 weight decay) / AdamW and their
    optax twins (parity/steps.py) on the
    cotangent loss: every loss, and every parameter after every step, within FLOAT64; dropout
    off (p=0) so train mode is deterministic on both sides."""
    torch.manual_seed(0)
    module = TorchMLP(p=0.0).double()
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    port = load_torch(MLP(p=0.0, param_dtype="float64", rngs=nnx.Rngs(0)), module)
    report = compare_steps(module, port, (ids,), opt, steps=3)
    assert report.passed, format_report(report)
    assert len(report.rows) == 3 * (1 + 7)
    assert port.fc1.kernel[...].dtype == jnp.float64


def test_nnx_embed_built_in_float32_looks_up_in_float32():
    """nnx.Embed sets its compute dtype when built (`dtype or param_dtype`): loading float64
    weights into one built with float32 parameters still looks them up in float32. The forward
    values are equal (the weights are float32-exact), the gradient of the table is rounded to
    float32 (4.7e-8 of scale). The diff fails it at the first output, on the dtype."""
    report = diff(torch_mlp, nnx_mlp_float32_embed, dtype="float64", grads=True)
    module, row = report.first_divergent()
    assert module == "embed" and "port dtype float32, torch float64" in row.note
    grad = next(r for r in report.section("grads") if r.label == "embed.weight")
    assert grad.passed is False and 1e-9 < grad.comparison.scale_rel < 1e-6
