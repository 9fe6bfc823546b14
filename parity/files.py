"""Checkpoint files read without ever unpickling code: `load_file` (.pt / .pth / .bin through
`torch.load(weights_only=True)`, torch imported only for those; .safetensors without torch), and
the `_orig_mod.` prefix torch.compile gives every key (`COMPILE_PREFIX`, `strip_prefix`).

Shared by the key maps (parity/gpt_params.py, parity/trm_params.py) and the commands that open an
original code base's checkpoint (train.source).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping

COMPILE_PREFIX = (
    "_orig_mod."  # torch.compile wraps the module; its state_dict keys gain this prefix
)


class UnsafeCheckpointError(ValueError):
    """A checkpoint file that would need to unpickle arbitrary code to load."""


def strip_prefix(state_dict: Mapping, prefix: str) -> dict:
    """Drop `prefix` from every key that has it (keys without it are kept unchanged)."""
    n = len(prefix)
    return {(k[n:] if k.startswith(prefix) else k): v for k, v in state_dict.items()}


def load_file(path: str | os.PathLike) -> dict:
    """Load a .pt/.pth/.bin (torch.save) or .safetensors file without ever unpickling code.

    torch files go through `torch.load(..., weights_only=True)`, which only reconstructs tensors and
    plain containers; a file carrying any other pickled object is refused with UnsafeCheckpointError.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file as _load_st  # lazy: only .safetensors files

        try:
            return dict(_load_st(path))
        except (TypeError, ValueError):  # bfloat16 tensors need torch to decode
            from safetensors.torch import load_file as _load_st_torch  # lazy: needs torch

            return dict(_load_st_torch(path))
    try:
        import torch  # lazy: only a torch file needs torch
    except ImportError as e:  # pragma: no cover - exercised only without the parity extra
        raise ImportError(
            f"reading the torch file {path} needs torch: pip install -e '.[parity]' "
            "(or convert it to .safetensors)"
        ) from e
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (EOFError, KeyError, UnicodeDecodeError, RuntimeError) as e:
        # what torch.load raises on an empty, text or other file (a bare key: "KeyError: 105"),
        # or on a damaged archive
        why = " ".join(f"{type(e).__name__}: {e}".split()[:12])
        raise ValueError(f"{path} is not a torch checkpoint, or a damaged one ({why})") from e
    except pickle.UnpicklingError as e:
        if "Unsupported global" not in str(e):  # no pickled code: not a checkpoint at all
            why = " ".join(str(e).split("WeightsUnpickler error:")[-1].split()[:8])
            raise ValueError(f"{path} is not a torch checkpoint ({why})") from e
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it contains pickled Python objects beyond tensors and plain "
            f"containers, and loading it would execute code (torch.load weights_only=True said: "
            f"{str(e).splitlines()[0]}). Re-save its state_dict with torch.save(model.state_dict()) "
            "or as .safetensors."
        ) from e
