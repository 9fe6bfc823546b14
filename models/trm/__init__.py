"""Tiny Recursive Model (SamsungSAILMontreal/TinyRecursiveModels) in Flax NNX, with its variants.

    from models.trm import TRM, TRMConfig, act_loss
    model = TRM(TRMConfig(...), rngs=nnx.Rngs(0))
    carry = model.initial_carry(batch)
    carry, outputs = model(carry, batch)              # one ACT step
    loss, metrics = act_loss(carry, outputs)           # upstream ACTLossHead

Files mirror parity/trm_torch/ (layers.py, modeling.py, losses.py); config.py, optim.py and
training.py are the port's own; the key map to upstream's checkpoints is parity/trm_params.py. `TRM` / `TRMCarry` are upstream's
TinyRecursiveReasoningModel_ACTV1 / ..._ACTV1Carry. Trainable weights are nnx.Param; H_init/L_init
are `LatentInit` and the puzzle table is `PuzzleTable` (neither is trained by AdamATan2 nor
averaged by the EMA). See docs/porting_trm.md.
"""

from models.trm.config import TRMConfig
from models.trm.layers import LatentInit, PuzzleTable
from models.trm.losses import act_loss
from models.trm.modeling import (
    TRM,
    TinyRecursiveReasoningModel_ACTV1,
    TinyRecursiveReasoningModel_ACTV1Carry,
    TRMCarry,
)

__all__ = [
    "TRM",
    "TRMCarry",
    "TRMConfig",
    "TinyRecursiveReasoningModel_ACTV1",
    "TinyRecursiveReasoningModel_ACTV1Carry",
    "LatentInit",
    "PuzzleTable",
    "act_loss",
]
