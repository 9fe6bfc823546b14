"""The nanoGPT <-> NNX weight map: `from_torch`, `to_torch`, `from_torch_file`, built with the
toolkit's own rules (parity/keymap.py) from nanoGPT's module tree (`describe_nanogpt`):

- torch `transformer.X` is the port's `X` (the ModuleDict is flattened: one `rename`);
- Linear `weight` (out, in) -> `kernel` (in, out): transposed (keymap's Linear rule);
- LayerNorm `weight` -> `scale`; Embedding `weight` -> `embedding`; biases copy as is;
- `lm_head.weight` is tied to `transformer.wte.weight` (the same storage): read from wte,
  written under both names;
- `_orig_mod.` (torch.compile) is stripped; a ckpt.pt dict is unwrapped via its 'model' entry;
- HF GPT-2 (Conv1D) stores the four projection weights already as (in, out): they are brought to
  Linear's (out, in) first; its `attn.bias` / `attn.masked_bias` buffers (and nanoGPT's
  manual-attention mask buffer `attn.bias`) are ignored.

HF GPT-2 weights (GPT2Model / GPT2LMHeadModel state_dicts, the hub's model.safetensors) were
trained with the tanh-approximate GELU ("gelu_new"): load them with GPTConfig(gelu_approximate=True).
nanoGPT checkpoints since June 2023 use the exact erf GELU, the default (False). The weights load
either way; only the activation differs (tests/test_gpt_convert.py::
test_safetensors_gpt2_file_loads_with_tanh_gelu shows the wrong one misses FLOAT32).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

import jax
import numpy as np
from flax import nnx

from models.gpt.modeling import GPT, GPTConfig, abstract_gpt
from parity.capture import prefix_rename
from parity.files import COMPILE_PREFIX, load_file, strip_prefix
from parity.keymap import KeyMap, TorchKey, build_keymap
from parity.state_dict import StateDictError, check_keys, to_numpy

_BUFFERS = (".attn.bias", ".attn.masked_bias")
_LINEARS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def describe_nanogpt(cfg: GPTConfig) -> list[TorchKey]:
    """nanoGPT's state_dict as keymap.describe_torch describes its module (key, module classes,
    shape, tie, enclosing modules), from the config alone: no torch needed
    (tests/test_gpt_convert.py compares it with describe_torch of parity.gpt_torch.GPT)."""
    C, V, T = cfg.n_embd, cfg.vocab_size, cfg.block_size
    shapes = {"attn.c_attn": (3 * C, C), "attn.c_proj": (C, C), "mlp.c_fc": (4 * C, C)}
    shapes["mlp.c_proj"] = (C, 4 * C)
    top = (("", ("GPT",)), ("transformer", ("ModuleDict",)))
    out = [
        TorchKey("transformer.wte.weight", ("Embedding",), (V, C), outer=top),
        TorchKey("transformer.wpe.weight", ("Embedding",), (T, C), outer=top),
    ]
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}"
        block = (*top, ("transformer.h", ("ModuleList",)), (p, ("Block",)))
        for mod in ("ln_1", *_LINEARS[:2], "ln_2", *_LINEARS[2:]):  # nanoGPT's key order
            kind, shape = ("LayerNorm", (C,)) if mod.startswith("ln_") else ("Linear", shapes[mod])
            outer = block
            if "." in mod:
                parent = mod.split(".")[0]
                outer = (
                    *block,
                    (f"{p}.{parent}", ({"attn": "CausalSelfAttention", "mlp": "MLP"}[parent],)),
                )
            out.append(TorchKey(f"{p}.{mod}.weight", (kind,), shape, outer=outer))
            if cfg.bias:
                out.append(TorchKey(f"{p}.{mod}.bias", (kind,), (shape[0],), outer=outer))
    out.append(TorchKey("transformer.ln_f.weight", ("LayerNorm",), (C,), outer=top))
    if cfg.bias:
        out.append(TorchKey("transformer.ln_f.bias", ("LayerNorm",), (C,), outer=top))
    out.append(
        TorchKey("lm_head.weight", ("Linear",), (V, C), tied_to="transformer.wte.weight",
                 outer=(("", ("GPT",)),))
    )  # fmt: skip
    return out


@functools.lru_cache(maxsize=16)
def keymap(config: GPTConfig) -> KeyMap:
    """nanoGPT's keys -> the port's variables by the toolkit's rules; StateDictError when the
    port and nanoGPT's module tree do not map one to one (a modeling change)."""
    described = describe_nanogpt(config)
    km = build_keymap(described, _abstract_model(config), rename=prefix_rename({"": "transformer"}))
    return km.check(f"nanoGPT's GPT{config}")


def _abstract_model(config: GPTConfig) -> GPT:
    return nnx.merge(*_abstract_gpt(config), copy=True)


def _is_conv1d(key: str) -> bool:
    return key.endswith(".weight") and any(f".{lin}.weight" in key for lin in _LINEARS)


def _normalise(state_dict: Mapping, cfg: GPTConfig, layout: str) -> tuple[dict, str]:
    """Unwrap ckpt.pt, strip _orig_mod., add transformer., drop buffers; detect the layout."""
    sd = state_dict
    if "model" in sd and isinstance(sd["model"], Mapping):  # nanoGPT ckpt.pt
        sd = sd["model"]
    sd = strip_prefix(sd, COMPILE_PREFIX)
    if not any(k.startswith("transformer.") for k in sd):  # HF GPT2Model: no prefix
        sd = {(k if k == "lm_head.weight" else "transformer." + k): v for k, v in sd.items()}
    sd = {k: v for k, v in sd.items() if not k.endswith(_BUFFERS)}
    if layout == "auto":
        C = cfg.n_embd
        shape = tuple(np.shape(sd.get("transformer.h.0.attn.c_attn.weight", ())))
        layout = "hf" if shape == (C, 3 * C) else "nanogpt"
    if layout not in ("nanogpt", "hf"):
        raise ValueError(f"layout must be 'auto', 'nanogpt' or 'hf', got {layout!r}")
    if layout == "hf":  # Conv1D stores (in, out): bring it to torch Linear's (out, in) to check
        sd = {k: (to_numpy(v).T if _is_conv1d(k) else v) for k, v in sd.items()}
    return sd, layout


def from_torch(state_dict: Mapping, config: GPTConfig, *, layout: str = "auto", rngs=None) -> GPT:
    """Build a GPT holding the weights of a nanoGPT (or HF GPT-2) state_dict.

    Accepts a plain state_dict or a nanoGPT ckpt.pt dict (its 'model' entry), keys with or without
    `_orig_mod.`, and HF GPT-2 keys (Conv1D layout, with or without `transformer.`; lm_head
    optional since tied). `layout` 'auto' detects HF by the shape of h.0's c_attn weight.
    Raises StateDictError listing every missing, unexpected or wrongly-shaped key.

    No weight is drawn at random: the module is built abstractly (nnx.eval_shape) and every
    parameter comes from the state_dict. `rngs` (default nnx.Rngs(0)) only seeds the dropout
    streams, one fork per Dropout in module order.
    """
    sd, layout = _normalise(state_dict, config, layout)
    expected = {tk.key: tk.shape for tk in describe_nanogpt(config) if tk.tied_to is None}
    source = "HF GPT-2 state_dict" if layout == "hf" else "nanoGPT state_dict"
    lm_head = sd.pop("lm_head.weight", None)
    check_keys(sd, expected, source=source)
    wte = to_numpy(sd["transformer.wte.weight"])
    if lm_head is not None:
        lm_head = to_numpy(lm_head)
        if lm_head.shape != wte.shape or not np.array_equal(lm_head, wte):
            raise StateDictError(
                f"{source}: lm_head.weight {lm_head.shape} is not tied to transformer.wte.weight "
                f"{wte.shape}; this port ties them (one array), as nanoGPT does"
            )
    model = _abstract_model(config)  # fresh Variables, values filled below
    dtype = config.param_dtype
    keymap(config).load(model, {k: to_numpy(v).astype(dtype) for k, v in sd.items()}, device=False)
    _fork_dropout_streams(model, rngs if rngs is not None else nnx.Rngs(0))
    abstract = [
        jax.tree_util.keystr(p)
        for p, v in jax.tree_util.tree_leaves_with_path(nnx.state(model))
        if isinstance(v, jax.ShapeDtypeStruct)
    ]
    if abstract:  # a variable the key map does not cover (a modeling change): never guess it
        raise RuntimeError(f"from_torch left variables without a value: {', '.join(abstract)}")
    return model


@functools.lru_cache(maxsize=16)
def _abstract_gpt(config: GPTConfig):
    """GPT's structure without values (graphdef, state of ShapeDtypeStructs), cached per config.

    GPT(config, rngs) run eagerly draws every initial weight op by op: seconds per new set of
    shapes (each op compiles for it), all of it then overwritten. eval_shape only traces.
    """
    return nnx.split(abstract_gpt(config))


def _fork_dropout_streams(model: GPT, rngs: nnx.Rngs) -> None:
    """Give each Dropout its own stream, forked from `rngs` in module order (eval_shape left them
    abstract). nnx.Dropout forks its collection's stream, or `default` when there is none."""
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Dropout) and node.rngs is not None:
            node.rngs = rngs[node.rng_collection].fork()


def to_numpy_state_dict(model: GPT) -> dict[str, np.ndarray]:
    """-> nanoGPT's state_dict keys and layouts as numpy arrays (no torch needed; lm_head.weight
    is the wte array itself)."""
    flat = {path: v.get_value() for path, v in nnx.iter_graph(model) if isinstance(v, nnx.Param)}
    out = {k: np.array(v, order="C") for k, v in keymap(model.config).to_torch(flat).items()}
    out["lm_head.weight"] = out["transformer.wte.weight"]  # tied: the same array
    return out


def to_torch(model: GPT) -> dict:
    """-> nanoGPT state_dict (torch tensors, flash-attention layout, lm_head tied to wte)."""
    import torch  # lazy: only writing torch tensors needs torch

    out = {k: torch.from_numpy(v) for k, v in to_numpy_state_dict(model).items()}
    out["lm_head.weight"] = out["transformer.wte.weight"]  # tied: the same tensor
    return out


def from_torch_file(path: str | os.PathLike, config: GPTConfig | None = None, **kwargs) -> GPT:
    """Load a nanoGPT ckpt.pt / state_dict .pt / .safetensors without unpickling code.

    With config=None the architecture comes from a ckpt.pt's `model_args` (dropout kept). An HF
    GPT-2 file needs a config with gelu_approximate=True (HF's tanh GELU; see the module docstring).
    """
    sd = load_file(path)
    if config is None:
        args = sd.get("model_args") if isinstance(sd, Mapping) else None
        if not isinstance(args, Mapping):
            raise ValueError(
                f"{os.fspath(path)} has no 'model_args' (it is not a nanoGPT ckpt.pt): pass config="
            )
        fields = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")
        config = GPTConfig(**{k: args[k] for k in fields if k in args})
    return from_torch(sd, config, **kwargs)
