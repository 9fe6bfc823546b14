"""HRM baseline (upstream models/recursive_reasoning/hrm.py): two modules, 1-step gradient.

The ACT wrapper is `models.trm.TRM` with `TRMConfig(arch="hrm")`: halting uses q_halt > q_continue
and, in training, target_q_continue comes from a second inner call (both handled in trm.py).
"""

from __future__ import annotations

import jax

from models.trm.layers import ReasoningModule, _tag
from models.trm.trm import InnerBase


class HRMInner(InnerBase):
    def _build(self, config, rngs):
        self.H_level = ReasoningModule(config, config.H_layers, "H_level", rngs=rngs)
        self.L_level = ReasoningModule(config, config.L_layers, "L_level", rngs=rngs)

    def recursion(self, carry, x, cos_sin):
        c = self.config
        z_H, z_L = carry["z_H"], carry["z_L"]
        # torch.no_grad over everything except the very last L update and the last H update
        for h in range(c.H_cycles):
            for l_step in range(c.L_cycles):
                if not (h == c.H_cycles - 1 and l_step == c.L_cycles - 1):
                    with _tag(f"H{h}/L"):
                        z_L = self.L_level(z_L, z_H + x, cos_sin)
            if h != c.H_cycles - 1:
                with _tag(f"H{h}/H"):
                    z_H = self.H_level(z_H, z_L, cos_sin)
        z_H, z_L = jax.lax.stop_gradient(z_H), jax.lax.stop_gradient(z_L)
        # 1-step gradient
        with _tag(f"H{c.H_cycles - 1}/L"):
            z_L = self.L_level(z_L, z_H + x, cos_sin)
        with _tag(f"H{c.H_cycles - 1}/H"):
            z_H = self.H_level(z_H, z_L, cos_sin)
        return {"z_H": z_H, "z_L": z_L}, z_H
