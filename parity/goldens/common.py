"""Shared plumbing for the golden-copy generators: importing upstream from a path, stand-ins for
what cannot run on a CPU, fixture files and the manifest."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np


def git_commit(src: Path) -> str:
    """The commit of the checkout at `src` ("unknown" when it is not a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


@contextlib.contextmanager
def upstream_on_path(src: Path, stand_ins: dict[str, types.ModuleType] | None = None):
    """Put the upstream checkout first on sys.path, with `stand_ins` registered in sys.modules
    (modules that need CUDA or are not installed), and take both away afterwards, including every
    upstream module imported meanwhile, so two checkouts never see each other's modules."""
    src = Path(src).resolve()
    before = set(sys.modules)
    sys.path.insert(0, str(src))
    saved = {name: sys.modules.get(name) for name in stand_ins or {}}
    sys.modules.update(stand_ins or {})
    try:
        yield src
    finally:
        sys.path.remove(str(src))
        for name in set(sys.modules) - before:
            mod = sys.modules.get(name)
            if str(getattr(mod, "__file__", "") or "").startswith(str(src)):
                del sys.modules[name]
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


def save_npz(out: Path, name: str, arrays: dict) -> Path:
    """Write `arrays` (name -> array-like; torch tensors are converted) to OUT/NAME.npz, compressed.
    bfloat16 tensors are stored as float32 (exact) with the key suffixed `@bf16`."""
    out.mkdir(parents=True, exist_ok=True)
    flat = {}
    for k, v in arrays.items():
        if hasattr(v, "detach"):  # torch.Tensor
            v = v.detach().cpu()
            if str(v.dtype) == "torch.bfloat16":
                flat[k + "@bf16"] = v.float().numpy()
                continue
            v = v.numpy()
        flat[k] = np.asarray(v)
    path = out / f"{name}.npz"
    np.savez_compressed(path, **flat)
    return path


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def write_manifest(out: Path, sections: dict) -> Path:
    """OUT/manifest.json: one section per upstream (commit, torch version, configs, seeds, stand-ins,
    fixture files). Keys sorted so regenerating gives the same bytes."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "manifest.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    old.update(sections)
    path.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")
    return path
