"""`python -m parity diff` from a user's project whose own `models`, `train` and `data` packages
shadow this repository's: the toolkit (a copy of parity/ alone on the path, as an install puts
it) ports the issue's UNet-style decoder block (GroupNorm, SiLU, ConvTranspose2d, Conv2d, 1x1
skip) by rule."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from tests.helpers import REPO as _REPO  # noqa: E402

REPO = pathlib.Path(_REPO)

UPBLOCK = """
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
    torch.manual_seed(0)
    return TorchUp(), (torch.randn(2, 8, 5, 5),)


class Up(nnx.Module):
    def __init__(self, dt, rngs):
        kw = dict(param_dtype=dt, rngs=rngs)
        self.norm = nnx.GroupNorm(8, num_groups=2, epsilon=1e-5, **kw)
        self.up = layers.conv_transpose(8, 4, 4, 2, 1, **kw)
        self.conv = nnx.Conv(4, 4, (3, 3), padding=[(1, 1), (1, 1)], **kw)
        self.skip = nnx.Conv(8, 4, (1, 1), **kw)

    def __call__(self, x_bchw):
        x = jnp.moveaxis(x_bchw, 1, -1)
        h = self.conv(self.up(jax.nn.silu(self.norm(x))))
        s = jnp.repeat(jnp.repeat(self.skip(x), 2, axis=1), 2, axis=2)
        return jnp.moveaxis(h + s, -1, 1)


def nnx_up(torch_module):
    return load_torch(Up(param_dtype(torch_module), nnx.Rngs(0)), torch_module)
"""


def test_diff_runs_where_the_users_packages_shadow_the_projects(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(REPO / "parity", site / "parity", ignore=shutil.ignore_patterns("__pycache__"))
    user = tmp_path / "project"
    for pkg in ("models", "train", "data"):
        (user / pkg).mkdir(parents=True)
        (user / pkg / "__init__.py").write_text('"""the user package"""\n')
    (user / "models" / "upblock.py").write_text(textwrap.dedent(UPBLOCK))
    env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-m", "parity", "diff", "models.upblock:torch_up", "models.upblock:nnx_up",
         "--dtype", "float64", "--grads"],
        cwd=user, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "every compared tensor agrees" in out.stdout
    assert "up.weight" in out.stdout  # the ConvTranspose2d weight mapped by rule
