"""The snippet of docs/porting_your_model.md, "Mutable state": torch.nn.BatchNorm2d ported to NNX
with its running statistics as nnx.BatchStat, proven against torch over train steps in float64;
and the two ways the stock nnx.BatchNorm differs from torch's running statistics."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from models.state_dict import check_keys, to_numpy  # noqa: E402
from parity.compare import EXACT, FLOAT32, FLOAT64, assert_close, compare  # noqa: E402

N_STEPS = 6
LR = 0.1


class Conv2d(nnx.Module):
    """torch.nn.Conv2d(bias=False) on NCHW, weight kept in torch's (out, in, kh, kw) layout so the
    key map is a rename (as models/trm keeps Linear's (out, in))."""

    def __init__(self, c_in, c_out, k, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.weight = nnx.Param(jax.random.normal(rngs.params(), (c_out, c_in, k, k), dtype) * 0.3)

    def __call__(self, x_nchw):
        return jax.lax.conv_general_dilated(
            x_nchw, self.weight[...], (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")
        )


class BatchNorm2d(nnx.Module):
    """torch.nn.BatchNorm2d (affine, tracking running statistics) on NCHW."""

    def __init__(self, num_features: int, *, eps=1e-5, momentum=0.1, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.ones(num_features, dtype))
        self.bias = nnx.Param(jnp.zeros(num_features, dtype))
        # torch buffers -> nnx.BatchStat: state that jit/grad carry out, never in the optimizer
        self.running_mean = nnx.BatchStat(jnp.zeros(num_features, dtype))
        self.running_var = nnx.BatchStat(jnp.ones(num_features, dtype))
        self.num_batches_tracked = nnx.BatchStat(jnp.zeros((), jnp.int32))
        self.eps, self.momentum = eps, momentum
        self.use_running_average = False  # the name nnx's .train() / .eval() / nnx.view set

    def __call__(self, x_nchw):
        if self.use_running_average:  # torch eval()
            mean, var = self.running_mean[...], self.running_var[...]
        else:  # torch train(): normalise with the batch's biased variance ...
            mean = x_nchw.mean((0, 2, 3))
            var = ((x_nchw - mean[:, None, None]) ** 2).mean((0, 2, 3))  # two-pass, as torch
            n = x_nchw.size // x_nchw.shape[1]
            m = self.momentum  # torch's momentum weighs the NEW batch (flax's: the old average)
            new_mean = (1 - m) * self.running_mean[...] + m * mean
            new_var = (1 - m) * self.running_var[...] + m * var * n / (n - 1)  # ... store unbiased
            self.running_mean[...] = jax.lax.stop_gradient(new_mean)
            self.running_var[...] = jax.lax.stop_gradient(new_var)
            self.num_batches_tracked[...] += 1
        x_hat = (x_nchw - mean[:, None, None]) / jnp.sqrt(var[:, None, None] + self.eps)
        return x_hat * self.weight[...][:, None, None] + self.bias[...][:, None, None]


class ConvBN(nnx.Module):
    """torch: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), ReLU)."""

    def __init__(self, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.conv = Conv2d(3, 4, 3, rngs=rngs, dtype=dtype)
        self.bn = BatchNorm2d(4, dtype=dtype)

    def __call__(self, x_nchw):
        return jax.nn.relu(self.bn(self.conv(x_nchw)))


# torch key -> (module, attribute): the whole weight map, buffers included
KEY_MAP = {
    "0.weight": ("conv", "weight"),
    "1.weight": ("bn", "weight"),
    "1.bias": ("bn", "bias"),
    "1.running_mean": ("bn", "running_mean"),
    "1.running_var": ("bn", "running_var"),
    "1.num_batches_tracked": ("bn", "num_batches_tracked"),
}


def _from_torch(state_dict, model: ConvBN) -> None:
    expected = {k: getattr(getattr(model, m), a).shape for k, (m, a) in KEY_MAP.items()}
    check_keys(state_dict, expected, source="ConvBN state_dict")
    for key, (mod, attr) in KEY_MAP.items():
        var = getattr(getattr(model, mod), attr)
        var[...] = jnp.asarray(to_numpy(state_dict[key]), var[...].dtype)


def _torch_pair():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4), torch.nn.ReLU()
    ).double()
    port = ConvBN(rngs=nnx.Rngs(0), dtype=jnp.float64)
    _from_torch(ref.state_dict(), port)
    return ref, port


def _batches(seed=0):
    rng = np.random.default_rng(seed)
    # a mean of 3 and spread 2 per channel: running statistics far from their (0, 1) start
    return [
        (3 + 2 * rng.normal(size=(2, 3, 5, 5)), rng.normal(size=(2, 4, 5, 5))) for _ in range(6)
    ]


def _loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


@nnx.jit
def _train_step(model, x, y):
    loss, grads = nnx.value_and_grad(_loss)(model, x, y)  # BatchStat updates come out too
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p, g: p - LR * g, params, grads))
    return loss


def test_batchnorm_running_statistics_match_torch_after_train_steps(x64):
    """N_STEPS jitted SGD steps of conv -> BatchNorm2d -> ReLU in float64: every loss, and after
    the last step every parameter and running statistic, equal torch's within FLOAT64; the step
    counter EXACT; then eval mode (running statistics) gives torch's eval output."""
    ref, port = _torch_pair()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    ref.train()
    port.train()
    for i, (x, y) in enumerate(_batches()):
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        opt.zero_grad()
        t_loss = torch.mean((ref(xt) - yt) ** 2)
        t_loss.backward()
        opt.step()
        assert_close(f"loss {i}", _train_step(port, x, y), t_loss.detach(), FLOAT64)
    sd = ref.state_dict()
    for key, (mod, attr) in KEY_MAP.items():
        tol = EXACT if key.endswith("num_batches_tracked") else FLOAT64
        assert_close(key, getattr(getattr(port, mod), attr)[...], sd[key], tol)
    ref.eval()
    port.eval()
    x = _batches(seed=1)[0][0]
    with torch.no_grad():
        expected = ref(torch.from_numpy(x))
    assert_close("eval output", port(x), expected, FLOAT64)


def test_stock_nnx_batchnorm_running_var_is_not_torchs(x64):
    """nnx.BatchNorm on torch's layout (axis=1), two-pass variance and torch's momentum converted
    (0.9 = 1 - 0.1): the running mean equals torch's, the running variance does not (flax stores
    the biased batch variance, torch the unbiased one: n/(n-1) = 50/49 here). With flax's default
    momentum 0.99 the running mean is also wrong. And in a float64 run its statistics stay float32
    (created float32 whatever dtype and param_dtype say), so they match torch's float64 ones
    to float32 round-off only."""
    bn_ref = torch.nn.BatchNorm2d(3).double().train()
    x = _batches()[0][0]
    with torch.no_grad():
        bn_ref(torch.from_numpy(x))
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
