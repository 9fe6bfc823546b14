"""Our PyTorch reference for TRM and its variants, written for this project (not upstream's code).

Module and attribute names equal upstream's, so `ACTLossHead(build_model(cfg)).state_dict()` has
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
from parity.trm_torch.models import ACTModel, build_model

__all__ = [
    "ACTLossHead",
    "ACTModel",
    "IGNORE_LABEL_ID",
    "build_model",
    "rms_norm",
    "softmax_cross_entropy",
    "stablemax_cross_entropy",
]
