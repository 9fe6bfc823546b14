"""Our PyTorch reference for TRM and its variants, written for this project (not upstream's code).

Files, classes and argument orders mirror the port (models/trm/); module and attribute names
equal upstream's, so `ACTLossHead(build_model(cfg)).state_dict()` has
upstream's keys (`model.inner.…`) and upstream checkpoints load unchanged. Runs on CPU; no CUDA-only
packages. Where upstream crashes this reference works; docs/porting_trm.md says how.
"""

from parity.trm_torch.layers import rms_norm
from parity.trm_torch.losses import (
    IGNORE_LABEL_ID,
    ACTLossHead,
    softmax_cross_entropy,
    stablemax_cross_entropy,
)
from parity.trm_torch.modeling import (
    TRM,
    TinyRecursiveReasoningModel_ACTV1,
    TinyRecursiveReasoningModel_ACTV1Carry,
    TRMCarry,
    build_model,
)

__all__ = [
    "ACTLossHead",
    "TRM",
    "TRMCarry",
    "TinyRecursiveReasoningModel_ACTV1",
    "TinyRecursiveReasoningModel_ACTV1Carry",
    "IGNORE_LABEL_ID",
    "build_model",
    "rms_norm",
    "softmax_cross_entropy",
    "stablemax_cross_entropy",
]
