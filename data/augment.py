"""Grid augmentations shared by the Maze and ARC builders and the ARC evaluator.

API
  DIHEDRAL_NAMES            the 8 transforms, by upstream id
  DIHEDRAL_INVERSE          id -> id of its inverse: [0, 3, 2, 1, 4, 5, 6, 7]
  dihedral_transform(grid, tid) / inverse_dihedral_transform(grid, tid)
  random_colour_permutation(rng) -> int array [10], a map old colour -> new colour with 0 fixed
  invert_permutation(perm), colour_map_to_str(perm), colour_map_from_str(s)

Ids follow upstream's order so augmented ARC puzzle names (`<id>|||t<k>|||<colour map>`) written by
either implementation decode the same way. All functions act on the last two axes and return
views where numpy allows (callers that mutate must copy).
"""

from __future__ import annotations

import numpy as np

DIHEDRAL_NAMES = (
    "identity",
    "rot90",
    "rot180",
    "rot270",
    "fliplr",
    "flipud",
    "transpose",
    "fliplr_rot90",  # anti-transpose: flip left-right after a counter-clockwise quarter turn
)
# Rotations invert each other (90 <-> 270); flips and both transposes are involutions.
DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)


def _t(grid: np.ndarray) -> np.ndarray:
    return np.swapaxes(grid, -2, -1)


# Basic slicing views instead of np.rot90/np.flip: the ARC builder applies ~10M of these.
_DIHEDRAL = (
    lambda g: g,
    lambda g: _t(g[..., ::-1]),  # rot90, counter-clockwise as np.rot90(g, 1)
    lambda g: g[..., ::-1, ::-1],  # rot180
    lambda g: _t(g)[..., ::-1],  # rot270
    lambda g: g[..., ::-1],  # fliplr
    lambda g: g[..., ::-1, :],  # flipud
    _t,  # transpose
    lambda g: _t(g[..., ::-1])[..., ::-1],  # fliplr(rot90(g))
)


def dihedral_transform(grid: np.ndarray, tid: int) -> np.ndarray:
    """Apply dihedral transform `tid` (0..7, upstream order) to the last two axes of `grid`."""
    if not 0 <= int(tid) < 8:
        raise ValueError(f"dihedral transform id must be in 0..7, got {tid}")
    return _DIHEDRAL[int(tid)](np.asarray(grid))


def inverse_dihedral_transform(grid: np.ndarray, tid: int) -> np.ndarray:
    """Undo `dihedral_transform(., tid)`."""
    if not 0 <= int(tid) < 8:
        raise ValueError(f"dihedral transform id must be in 0..7, got {tid}")
    return dihedral_transform(grid, DIHEDRAL_INVERSE[int(tid)])


def random_colour_permutation(rng: np.random.Generator, num_colours: int = 10) -> np.ndarray:
    """A map old colour -> new colour (index -> value) permuting 1..num_colours-1; 0 (black /
    background) stays 0, as upstream's ARC augmentation."""
    return np.concatenate([[0], rng.permutation(np.arange(1, num_colours))]).astype(np.uint8)


def invert_permutation(perm: np.ndarray) -> np.ndarray:
    """inv such that inv[perm[c]] == c for every colour c."""
    perm = np.asarray(perm)
    if sorted(perm.tolist()) != list(range(len(perm))):
        raise ValueError(f"not a permutation of 0..{len(perm) - 1}: {perm.tolist()}")
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm), dtype=perm.dtype)
    return inv


def colour_map_to_str(perm: np.ndarray) -> str:
    """'0123456789'-style string: character c is the new colour of old colour c."""
    return "".join(str(int(v)) for v in perm)


def colour_map_from_str(s: str) -> np.ndarray:
    if len(s) != 10 or not s.isdigit():
        raise ValueError(f"colour map must be 10 digits, got {s!r}")
    perm = np.array([int(ch) for ch in s], dtype=np.uint8)
    invert_permutation(perm)  # validates
    return perm
