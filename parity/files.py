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
        return _load_safetensors(path)
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
        code = _globals_beyond_weights(torch, path)
        if not code:  # no pickled code: not a checkpoint at all
            why = " ".join(str(e).split("WeightsUnpickler error:")[-1].split()[:8])
            raise ValueError(f"{path} is not a torch checkpoint ({why})") from e
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it asks to run code (GLOBAL {', '.join(code)}); only "
            "tensors and plain containers load. Re-save its state_dict with "
            "torch.save(model.state_dict()) or as .safetensors."
        ) from e


def _load_safetensors(path: str) -> dict:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file as _load_st  # lazy: only .safetensors files

    try:
        try:
            return dict(_load_st(path))
        except (TypeError, ValueError):  # bfloat16 tensors need torch to decode
            from safetensors.torch import load_file as _load_st_torch  # lazy: needs torch

            return dict(_load_st_torch(path))
    except SafetensorError as e:  # a damaged or truncated file, or not one at all
        raise ValueError(f"{path} is not a safetensors file, or a damaged one ({e})") from e


def _globals_beyond_weights(torch, path: str) -> list[str]:
    """The names the file's pickle imports that torch's weights-only loader refuses (a function
    or class that unpickling would call: code), read from the pickle's opcodes, not from the
    wording of torch's error; [] when the file's pickle cannot be read that way."""
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # not a zip archive (the legacy format), or no such function
        pass
    try:
        with open(path, "rb") as f:
            names = pickle_globals(f.read())
    except (OSError, ValueError):
        return []
    return [n for n in names if not n.startswith(_WEIGHTS_MODULES)]


# What a legacy-format torch file's pickle imports to rebuild tensors: not code
_WEIGHTS_MODULES = ("torch.", "collections.OrderedDict", "_codecs.encode", "builtins.set")


def pickle_globals(data: bytes) -> list[str]:
    """`module.name` of every class or function the pickles in `data` import (GLOBAL and
    STACK_GLOBAL opcodes, the latter's strings followed through the memo), without unpickling
    anything. ValueError when `data` does not start with a pickle."""
    import io
    import pickletools

    stream, names = io.BytesIO(data), []
    while stream.tell() < len(data):
        strings, memo = [], {}
        try:
            for op, arg, _ in pickletools.genops(stream):
                if op.name == "GLOBAL":
                    names.append(arg.replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    names.append(f"{strings[-2]}.{strings[-1]}")
                elif op.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                    memo[len(memo) if op.name == "MEMOIZE" else arg] = (
                        strings[-1] if strings else None
                    )
                elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                    strings.append(memo.get(arg))
                elif isinstance(arg, str) and ("UNICODE" in op.name or op.name.endswith("STRING")):
                    strings.append(arg)
        except ValueError:
            if not names and stream.tell() == 0:
                raise
            break  # what follows the pickles (a legacy file's raw tensor bytes)
    return names
