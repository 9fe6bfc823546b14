"""The paper's ablations and the transformer baseline, on the shared InnerBase.

- trm_singlez: one latent z_L; z_L <- f(z_L + x) L_cycles times, then z_L <- f(z_L); heads read z_L.
- trm_hier6: six latents z_L1..z_L6 (own init buffers); L step j replaces z_L[j] with
  f(sum z_L, z_H + x); the H step uses sum z_L.
- transformers_baseline (upstream Model_ACTV2): H_level applied once per ACT step, with gradient.
"""

from __future__ import annotations

import jax

from models.trm.layers import ReasoningModule, _tag
from models.trm.trm import InnerBase, repeat


class SingleZInner(InnerBase):
    latent_names = ("z_L",)
    init_names = ("L_init",)

    def _build(self, config, rngs):
        self.L_level = ReasoningModule(config, config.L_layers, "L_level", rngs=rngs)

    def _cycle(self, z_L, x, cos_sin, h):
        c = self.config
        with _tag(f"H{h}/L"):
            # injection added outside the module (upstream's singlez ReasoningModule takes none)
            z_L = repeat(lambda z: self.L_level(z + x, None, cos_sin), z_L, c.L_cycles, c.scan)
        with _tag(f"H{h}/H"):
            z_L = self.L_level(z_L, None, cos_sin)
        return z_L

    def recursion(self, carry, x, cos_sin):
        z_L = carry["z_L"]
        for h in range(self.config.H_cycles - 1):
            z_L = self._cycle(z_L, x, cos_sin, h)
        z_L = jax.lax.stop_gradient(z_L)  # torch.no_grad over the first H_cycles-1 cycles
        z_L = self._cycle(z_L, x, cos_sin, self.config.H_cycles - 1)
        return {"z_L": z_L}, z_L


class Hier6Inner(InnerBase):
    latent_names = ("z_H", "z_L1", "z_L2", "z_L3", "z_L4", "z_L5", "z_L6")
    init_names = ("H_init", "L1_init", "L2_init", "L3_init", "L4_init", "L5_init", "L6_init")

    def _build(self, config, rngs):
        self.L_level = ReasoningModule(config, config.L_layers, "L_level", rngs=rngs)

    @staticmethod
    def _sum(z_L):
        s = z_L[0]
        for z in z_L[1:]:  # left to right, as upstream's a+b+c+d+e+f
            s = s + z
        return s

    def _cycle(self, z_H, z_L, x, cos_sin, h):
        z_L = list(z_L)
        with _tag(f"H{h}/L"):
            for j in range(self.config.L_cycles):
                z_L[j] = self.L_level(self._sum(z_L), z_H + x, cos_sin)
        with _tag(f"H{h}/H"):
            z_H = self.L_level(z_H, self._sum(z_L), cos_sin)
        return z_H, z_L

    def recursion(self, carry, x, cos_sin):
        z_H, z_L = carry["z_H"], [carry[n] for n in self.latent_names[1:]]
        for h in range(self.config.H_cycles - 1):
            z_H, z_L = self._cycle(z_H, z_L, x, cos_sin, h)
        z_H, z_L = jax.tree.map(jax.lax.stop_gradient, (z_H, z_L))  # torch.no_grad cycles
        z_H, z_L = self._cycle(z_H, z_L, x, cos_sin, self.config.H_cycles - 1)
        return {"z_H": z_H, **dict(zip(self.latent_names[1:], z_L, strict=True))}, z_H


class BaselineInner(InnerBase):
    latent_names = ("z_H",)
    init_names = ("H_init",)

    def _build(self, config, rngs):
        self.H_level = ReasoningModule(config, config.H_layers, "H_level", rngs=rngs)

    def recursion(self, carry, x, cos_sin):
        with _tag("H0/H"):
            z_H = self.H_level(carry["z_H"], x, cos_sin)
        return {"z_H": z_H}, z_H
