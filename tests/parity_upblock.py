"""A UNet-style decoder block and its Flax NNX port, written as a user of the toolkit writes them
in a project of their own: GroupNorm, SiLU, ConvTranspose2d, Conv2d and a 1x1 skip (upsampled by
nearest neighbour). The port keeps flax's channels-last layout inside (stock nnx.GroupNorm and
nnx.Conv, `parity.layers.conv_transpose`) and takes and returns torch's NCHW at its edges.

It imports only the toolkit, torch, jax and flax: tests/test_parity_shadowed.py copies this file
into a project whose own `models`, `train` and `data` packages shadow the repository's, as
`models/upblock.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from flax import nnx

from parity import layers
from parity.keymap import load_torch, param_dtype


class TorchUp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(2, 8)
        self.up = torch.nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.skip = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        h = self.conv(self.up(torch.nn.functional.silu(self.norm(x))))
        return h + torch.nn.functional.interpolate(self.skip(x), scale_factor=2.0)


def torch_up():
    """TORCH_FACTORY: 8 channels on a 5 x 5 map (sizes that tell NCHW from NHWC by shape)."""
    torch.manual_seed(0)
    return TorchUp(), (torch.randn(2, 8, 5, 5),)


def torch_up_square():
    """TORCH_FACTORY with 8 channels on an 8 x 8 map: the norm's output has the same shape in
    both layouts."""
    torch.manual_seed(0)
    return TorchUp(), (torch.randn(2, 8, 8, 8),)


class Up(nnx.Module):
    """`eps`: GroupNorm's epsilon (torch's is 1e-5; flax's default 1e-6 is wrong on purpose)."""

    def __init__(self, dt, rngs, eps=1e-5):
        kw = dict(param_dtype=dt, rngs=rngs)
        self.norm = nnx.GroupNorm(8, num_groups=2, epsilon=eps, **kw)
        self.up = layers.conv_transpose(8, 4, 4, 2, 1, **kw)
        self.conv = nnx.Conv(4, 4, (3, 3), padding=[(1, 1), (1, 1)], **kw)
        self.skip = nnx.Conv(8, 4, (1, 1), **kw)

    def __call__(self, x_bchw):
        x = jnp.moveaxis(x_bchw, 1, -1)
        h = self.conv(self.up(jax.nn.silu(self.norm(x))))
        s = jnp.repeat(jnp.repeat(self.skip(x), 2, axis=1), 2, axis=2)
        return jnp.moveaxis(h + s, -1, 1)


def nnx_up(torch_module):
    """NNX_FACTORY: the port holding the torch block's weights."""
    return load_torch(Up(param_dtype(torch_module), nnx.Rngs(0)), torch_module)


def nnx_up_flax_eps(torch_module):
    """Wrong on purpose: GroupNorm with flax's default epsilon 1e-6."""
    return load_torch(Up(param_dtype(torch_module), nnx.Rngs(0), eps=1e-6), torch_module)
