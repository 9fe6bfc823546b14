"""Tiny Recursive Model (SamsungSAILMontreal/TinyRecursiveModels) in Flax NNX, with its variants.

    from models.trm import TRM, TRMConfig, act_loss
    model = TRM(TRMConfig(...), rngs=nnx.Rngs(0))
    carry = model.initial_carry(batch)
    carry, outputs = model(carry, batch)              # one ACT step
    loss, metrics = act_loss(carry, outputs)           # upstream ACTLossHead

Trainable weights are nnx.Param; H_init/L_init are `LatentInit` and the puzzle table is
`PuzzleTable` (neither is trained by AdamATan2 nor averaged by the EMA). See docs/porting_trm.md.
"""

from models.trm.config import TRMConfig
from models.trm.layers import LatentInit, PuzzleTable, capture_intermediates
from models.trm.trm import TRM, TRMCarry

__all__ = [
    "TRM",
    "TRMCarry",
    "TRMConfig",
    "LatentInit",
    "PuzzleTable",
    "capture_intermediates",
    "act_loss",
    "from_torch",
    "to_torch",
]


def __getattr__(name):  # loss and converters load on first use
    if name == "act_loss":
        from models.trm.loss import act_loss

        return act_loss
    if name in ("from_torch", "to_torch"):
        from models.trm import params

        return getattr(params, name)
    raise AttributeError(name)
