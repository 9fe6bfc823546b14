"""Checkpoint key map between upstream state_dicts and `models.trm.TRM` (nothing else lives here),
by the toolkit's rules (parity/keymap.py).

Upstream key = ["_orig_mod."] + "model.inner." + the port's path under `TRM.inner`, with the same
attribute names: the torch layout is kept (CastedLinear's (out, in) weight), so every key maps by
keymap's first rule, the same name copied as is, and the one `rename` puts `inner` under
`model.` (upstream's ACT loss head holds the model). RoPE tables are recomputed, and the
non-persistent `puzzle_emb.local_weights/local_ids` never appear.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from models.trm.config import TRMConfig, upstream_config
from models.trm.layers import PuzzleTable
from models.trm.modeling import TRM
from parity.capture import prefix_rename
from parity.files import COMPILE_PREFIX, strip_prefix
from parity.keymap import KeyMap, TorchKey, build_keymap, variable_at
from parity.state_dict import to_numpy

INNER_PREFIX = "model.inner."
PUZZLE_KEY = INNER_PREFIX + "puzzle_emb.weights"
_RENAME = prefix_rename({"inner": "model.inner"})


def keymap(state_dict, model: TRM) -> KeyMap:
    """The keys of `state_dict` (upstream's, `_orig_mod.` stripped) -> the variables of `model`;
    its report lists every missing, unexpected and wrongly shaped key."""
    described = [TorchKey(k, (), tuple(np.shape(v))) for k, v in state_dict.items()]
    return build_keymap(described, model, rename=_RENAME)


def from_torch(state_dict, config: TRMConfig, *, seed: int = 0, source: str = "state_dict"):
    """Build a TRM holding the weights of an upstream (or parity.trm_torch) state_dict.

    Accepts keys with or without `_orig_mod.` (torch.compile). A puzzle table of another row count
    is replaced by the mean of its rows broadcast to this config's table (upstream load_checkpoint,
    for fine-tuning on new puzzles). Anything else missing, unexpected or wrongly shaped raises
    parity.state_dict.StateDictError listing every such key. `seed` seeds the exploration stream.
    """
    sd = {k: to_numpy(v) for k, v in strip_prefix(state_dict, COMPILE_PREFIX).items()}
    model = nnx.eval_shape(lambda: TRM(config, rngs=nnx.Rngs(seed)))
    table = nnx.state(model.inner, PuzzleTable)
    expected = [v.shape for v in jax.tree.leaves(table)]
    if PUZZLE_KEY in sd and expected and sd[PUZZLE_KEY].shape != expected[0]:
        rows = sd[PUZZLE_KEY].astype(np.float32)
        if rows.ndim == 2 and rows.shape[1] == expected[0][1]:
            sd[PUZZLE_KEY] = np.broadcast_to(rows.mean(0, keepdims=True), expected[0]).copy()
    km = keymap(sd, model).check(source)
    for e in km.entries:  # the variable's own dtype (H_init / L_init keep the forward dtype)
        var = variable_at(model, e.nnx_path)
        sd[e.torch_key] = np.asarray(sd[e.torch_key]).astype(var.get_value().dtype)
    km.load(model, sd)
    # eval_shape left the RNG stream abstract: give it real state
    model.exploration_rngs = nnx.Rngs(exploration=seed)
    return model


def upstream_keys(config: TRMConfig) -> set[str]:
    """The state_dict keys upstream's model has for `config` (no `_orig_mod.`): the PyTorch
    reference's, built on torch's meta device (no arrays) with the fields that make `config` a
    variant without an upstream twin (models.trm.config.variant_fields) at their defaults.
    Without torch (a .safetensors file read by the base install): the port's keys for that
    config, the same set (tests/test_trm_variants.py)."""
    upstream = upstream_config(config)
    try:
        import torch  # lazy: the reference is torch
    except ImportError:
        model = nnx.eval_shape(lambda: TRM(upstream, rngs=nnx.Rngs(0)))
        return {INNER_PREFIX + ".".join(map(str, p)) for p, _ in _variables(model.inner)}
    from parity.trm_torch import ACTLossHead, build_model

    with torch.device("meta"):
        return set(ACTLossHead(build_model(upstream)).state_dict())


def _variables(module):
    """(path, variable) of each variable a state_dict holds (RNG state is not one)."""
    for path, var in nnx.iter_graph(module):
        if isinstance(var, nnx.Variable) and not isinstance(var, nnx.RngState):
            yield path, var


def to_torch(model, *, compiled: bool = False) -> dict:
    """TRM -> upstream state_dict (torch tensors; H_init/L_init keep the forward dtype, e.g. bf16)."""
    import torch  # lazy: only writing torch tensors needs torch

    prefix = COMPILE_PREFIX if compiled else ""
    out = {}
    for path, var in _variables(model.inner):
        value = np.asarray(var.get_value())
        key = prefix + INNER_PREFIX + ".".join(str(p) for p in path)
        if value.dtype.name == "bfloat16":
            out[key] = torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16)
        else:
            out[key] = torch.from_numpy(value.copy())
    return out
