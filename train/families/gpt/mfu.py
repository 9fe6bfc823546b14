"""nanoGPT's `GPT.estimate_mfu` for this port: models/gpt/flops.py's count of one iteration
against a chip's peak FLOP/s (a number, or a chip name from train/flops.py's table).

    estimate_mfu(preset("shakespeare_char"), fwdbwd_per_iter=64, dt=0.1, peak_flops="A100")
"""

from __future__ import annotations

from models.gpt.flops import gpt_flops_per_step
from train.flops import PEAK_FLOPS, peak_flops_for


def estimate_mfu(config, fwdbwd_per_iter: int, dt: float, peak_flops=312e12) -> float:
    """nanoGPT's `GPT.estimate_mfu`: (flops_per_token · T · fwdbwd_per_iter / dt) / peak.

    `peak_flops` is FLOP/s per device or a chip name for `peak_flops_for` ('A100', 'H100',
    'TPUv4', ...). nanoGPT fixes it at the A100's 312e12 (hence its MFU > 100% on an H100).
    """
    config = getattr(config, "config", config)
    if isinstance(peak_flops, str):
        peak = peak_flops_for(peak_flops)
        if peak is None:
            raise KeyError(f"unknown peak_flops preset {peak_flops!r}; known: {sorted(PEAK_FLOPS)}")
    else:
        peak = float(peak_flops)
    return gpt_flops_per_step(config, fwdbwd_per_iter) / dt / peak
