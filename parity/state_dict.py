"""State_dict arrays and key checks without torch: what the parity toolkit, its key maps and the
commands that open checkpoints all need; it imports nothing from the project's models/, train/
or data/.

A state_dict here is any mapping from key to array-like: torch tensors (converted by duck typing,
so this module never imports torch), numpy arrays or JAX arrays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import ml_dtypes
import numpy as np


class StateDictError(ValueError):
    """Missing, unexpected or wrongly-shaped keys. The message lists every offending key."""


def to_numpy(value) -> np.ndarray:
    """torch.Tensor / jax.Array / numpy -> numpy, keeping bfloat16 as ml_dtypes.bfloat16."""
    if hasattr(value, "detach"):  # torch.Tensor
        t = value.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            return t.float().numpy().astype(ml_dtypes.bfloat16)
        return t.numpy().copy()
    return np.asarray(value)


def check_keys(
    state_dict: Mapping,
    expected: Mapping[str, tuple[int, ...]],
    *,
    source: str = "state_dict",
    ignore: Iterable[str] = (),
) -> None:
    """Raise StateDictError listing every missing, unexpected and wrongly-shaped key."""
    ignore = tuple(ignore)
    got = {
        k: tuple(np.shape(v)) for k, v in state_dict.items() if not (ignore and k.endswith(ignore))
    }
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    wrong = sorted(
        f"{k}: got {got[k]}, expected {tuple(expected[k])}"
        for k in set(got) & set(expected)
        if tuple(got[k]) != tuple(expected[k])
    )
    if missing or unexpected or wrong:
        parts = [f"{source} does not match the model:"]
        if missing:
            parts.append(f"  missing keys ({len(missing)}): " + ", ".join(missing))
        if unexpected:
            parts.append(f"  unexpected keys ({len(unexpected)}): " + ", ".join(unexpected))
        if wrong:
            parts.append(f"  wrong shapes ({len(wrong)}):\n    " + "\n    ".join(wrong))
        raise StateDictError("\n".join(parts))
