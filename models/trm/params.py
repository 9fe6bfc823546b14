"""Checkpoint key map between upstream state_dicts and `models.trm.TRM` (nothing else lives here).

Upstream key  = ["_orig_mod."] + "model.inner." + NNX path of the variable under `TRM.inner`, with
the same attribute names (torch layout kept, so no transposes). RoPE tables are recomputed, and the
non-persistent `puzzle_emb.local_weights/local_ids` never appear.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.state_dict import COMPILE_PREFIX, check_keys, strip_prefix, to_numpy
from models.trm.config import TRMConfig
from models.trm.models import TRM

INNER_PREFIX = "model.inner."
PUZZLE_KEY = INNER_PREFIX + "puzzle_emb.weights"


def _key(path) -> str:
    return INNER_PREFIX + ".".join(str(p) for p in path)


def _variables(model) -> dict:
    """torch key -> nnx.Variable for every checkpointed variable (params, inits, puzzle table)."""
    out = {}
    for path, var in nnx.iter_graph(model.inner):
        if isinstance(var, nnx.Variable) and not isinstance(var, nnx.RngState):
            out[_key(path)] = var
    return out


def from_torch(state_dict, config: TRMConfig, *, seed: int = 0, source: str = "state_dict"):
    """Build a TRM holding the weights of an upstream (or parity.trm_torch) state_dict.

    Accepts keys with or without `_orig_mod.` (torch.compile). A puzzle table of another row count
    is replaced by the mean of its rows broadcast to this config's table (upstream load_checkpoint,
    for fine-tuning on new puzzles). Anything else missing, unexpected or wrongly shaped raises
    models.state_dict.StateDictError listing every such key. `seed` seeds the exploration stream.
    """
    sd = {k: to_numpy(v) for k, v in strip_prefix(state_dict, COMPILE_PREFIX).items()}
    model = nnx.eval_shape(lambda: TRM(config, rngs=nnx.Rngs(seed)))
    variables = _variables(model)
    expected = {k: tuple(v.shape) for k, v in variables.items()}
    if PUZZLE_KEY in sd and PUZZLE_KEY in expected and sd[PUZZLE_KEY].shape != expected[PUZZLE_KEY]:
        table = sd[PUZZLE_KEY].astype(np.float32)
        if table.ndim == 2 and table.shape[1] == expected[PUZZLE_KEY][1]:
            sd[PUZZLE_KEY] = np.broadcast_to(
                table.mean(0, keepdims=True), expected[PUZZLE_KEY]
            ).copy()
    check_keys(sd, expected, source=source)
    for k, var in variables.items():
        var.set_value(np.asarray(sd[k]).astype(var.get_value().dtype))
    # eval_shape left the RNG stream abstract: give it real state
    model.exploration_rngs = nnx.Rngs(exploration=seed)
    for var in variables.values():
        var.set_value(jnp.asarray(var.get_value()))
    return model


def to_torch(model, *, compiled: bool = False) -> dict:
    """TRM -> upstream state_dict (torch tensors; H_init/L_init keep the forward dtype, e.g. bf16)."""
    import torch  # lazy: models/ never imports torch at module level

    prefix = COMPILE_PREFIX if compiled else ""
    out = {}
    for k, var in _variables(model).items():
        value = np.asarray(var.get_value())
        if value.dtype.name == "bfloat16":
            out[prefix + k] = torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16)
        else:
            out[prefix + k] = torch.from_numpy(value.copy())
    return out
