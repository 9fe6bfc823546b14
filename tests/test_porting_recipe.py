"""The example of docs/porting_your_model.md, "Mutable state": a torch BatchNorm2d ported to NNX
with its running statistics as nnx.BatchStat (tests/parity_ports.py), trained by a hand-written
jitted step as a trainer would, proven against torch over train steps in float64; and the three
ways the stock nnx.BatchNorm differs from torch's running statistics."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from parity.capture import nnx_state  # noqa: E402
from parity.compare import EXACT, FLOAT32, FLOAT64, assert_close, compare  # noqa: E402
from parity.keymap import build_keymap, describe_torch, load_torch  # noqa: E402
from tests.parity_ports import ConvBN  # noqa: E402
from tests.test_parity_conv_bn import TorchConvBN  # noqa: E402

N_STEPS = 6
LR = 0.1


def _batches(n=N_STEPS, seed=0):
    g = torch.Generator().manual_seed(seed)
    # a mean of 3 and spread 2 per channel: running statistics far from their (0, 1) start
    return [
        (3 + 2 * torch.randn(2, 3, 8, 8, generator=g, dtype=torch.float64),
         torch.randn(2, 8, 4, 4, generator=g, dtype=torch.float64))
        for _ in range(n)
    ]  # fmt: skip


def _loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


@nnx.jit
def _train_step(model, x, y):
    loss, grads = nnx.value_and_grad(_loss)(model, x, y)  # BatchStat updates come out too
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p, g: p - LR * g, params, grads))
    return loss


def test_batchnorm_running_statistics_match_torch_after_train_steps(x64):
    """N_STEPS jitted SGD steps of conv -> BatchNorm2d -> ReLU -> conv -> BatchNorm2d in float64:
    every loss, and after the last step every parameter and running statistic, equal torch's
    within FLOAT64, the step counters EXACT; then eval mode (running statistics) gives torch's
    eval output."""
    torch.manual_seed(0)
    ref = TorchConvBN().double()
    port = load_torch(ConvBN(param_dtype="float64", rngs=nnx.Rngs(0)), ref)
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    ref.train()
    port.train()
    for i, (x, y) in enumerate(_batches()):
        opt.zero_grad()
        t_loss = torch.mean((ref(x) - y) ** 2)
        t_loss.backward()
        opt.step()
        assert_close(f"loss {i}", _train_step(port, x.numpy(), y.numpy()), t_loss.detach(), FLOAT64)
    trained = build_keymap(describe_torch(ref), port).to_torch(nnx_state(port))  # torch layout
    for key, value in ref.state_dict().items():
        tol = EXACT if key.endswith("num_batches_tracked") else FLOAT64
        assert_close(key, trained[key], value, tol)
    ref.eval()
    port.eval()
    x = _batches(1, seed=1)[0][0]
    with torch.no_grad():
        expected = ref(x)
    assert_close("eval output", port(x.numpy()), expected, FLOAT64)


def test_stock_nnx_batchnorm_running_var_is_not_torchs(x64):
    """nnx.BatchNorm on torch's layout (axis=1), two-pass variance and torch's momentum converted
    (0.9 = 1 - 0.1): the running mean equals torch's, the running variance does not (flax stores
    the biased batch variance, torch the unbiased one: n/(n-1) = 128/127 here). With flax's
    default momentum 0.99 the running mean is also wrong. And in a float64 run its statistics stay
    float32 (created float32 whatever dtype and param_dtype say), so they match torch's float64
    ones to float32 round-off only."""
    bn_ref = torch.nn.BatchNorm2d(3).double().train()
    x = _batches(1)[0][0]
    with torch.no_grad():
        bn_ref(x)
    x = x.numpy()
    for momentum, mean_ok in ((0.9, True), (0.99, False)):
        bn = nnx.BatchNorm(
            3,
            axis=1,
            momentum=momentum,
            use_fast_variance=False,
            dtype=jnp.float64,
            param_dtype=jnp.float64,
            rngs=nnx.Rngs(0),
        )
        with warnings.catch_warnings():  # JAX warns about the float64 -> float32 store below
            warnings.simplefilter("ignore", FutureWarning)
            bn(jnp.asarray(x))
        # the statistics are created float32 whatever dtype/param_dtype say: float32-accurate only
        assert bn.mean[...].dtype == jnp.float32 and bn.var[...].dtype == jnp.float32
        mean = compare("running_mean", bn.mean[...], bn_ref.running_mean, FLOAT32)
        assert mean.passed == mean_ok, mean.message()
        assert not compare("running_mean", bn.mean[...], bn_ref.running_mean, FLOAT64).passed
        var = compare("running_var", bn.var[...], bn_ref.running_var, FLOAT32)
        assert not var.passed, var.message()
        biased = x.transpose(1, 0, 2, 3).reshape(3, -1).var(axis=1)  # what flax stores instead
        expected_var = momentum * 1.0 + (1 - momentum) * biased
        assert_close("flax running_var", bn.var[...], expected_var, FLOAT32)
