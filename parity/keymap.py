"""A torch state_dict into an NNX model's variables by rule, and back, with a report of every key
that does not map.

The rule for one state_dict key `<module path>.<attribute>`: the NNX variable at the same module
path (attribute names mirror torch's; `rename` covers a flattened container) and

1. the same attribute name: copied as is (a port that keeps torch's layout, like TRM's
   CastedLinear, or a port of BatchNorm that keeps `running_mean`);
2. otherwise the rule of the torch module's class (or a base class) for that attribute:

   | torch module | torch attribute | NNX attribute | layout |
   |---|---|---|---|
   | Linear (and subclasses) | weight (out, in) | kernel (in, out) | transposed |
   | Conv1d / Conv2d / Conv3d | weight (O, I, *k) | kernel (*k, I, O) | OIHW -> HWIO |
   | Embedding | weight | embedding | as is |
   | LayerNorm, RMSNorm, GroupNorm | weight | scale | as is |
   | BatchNorm1d/2d/3d | weight, running_mean, running_var | scale, mean, var | as is |
   | BatchNorm1d/2d/3d | num_batches_tracked | (none: nnx.BatchNorm has no counter) | dropped |

   biases keep their name (`bias`) and layout, so rule 1 covers them;
3. a key whose tensor shares storage with another key (tied weights: nanoGPT's lm_head and wte)
   needs no variable of its own when the port holds the other one.

Everything else is reported: torch keys with no NNX variable (`unexpected`), NNX variables no key
fills (`missing`), and pairs whose shapes disagree after the layout rule (`wrong_shapes`).

The torch side is described once (`describe_torch`: key, module classes, shape, parameter or
buffer, tie) as plain data, so a map can be built, and goldens loaded, without torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import numpy as np

from parity.capture import Rename, dotted
from parity.state_dict import StateDictError, to_numpy


@dataclasses.dataclass(frozen=True)
class TorchKey:
    """One state_dict entry: its key, the class names of its module (the class first, then its
    bases up to torch.nn.Module), its shape, parameter or buffer, and the earlier key it shares
    storage with (tied weights), if any."""

    key: str
    kinds: tuple[str, ...]
    shape: tuple[int, ...]
    parameter: bool = True
    tied_to: str | None = None

    @property
    def module(self) -> str:
        return self.key.rpartition(".")[0]

    @property
    def attr(self) -> str:
        return self.key.rpartition(".")[2]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping) -> TorchKey:
        return cls(d["key"], tuple(d["kinds"]), tuple(d["shape"]), d["parameter"], d["tied_to"])


def describe_torch(module) -> list[TorchKey]:
    """Every state_dict key of a torch module, in state_dict order, as a TorchKey."""
    params = {id(p) for p in module.parameters()}
    seen: dict[tuple, str] = {}
    out = []
    for key, t in module.state_dict(keep_vars=True).items():
        owner = module.get_submodule(key.rpartition(".")[0])
        kinds = tuple(c.__name__ for c in type(owner).__mro__[: type(owner).__mro__.index(_nn())])
        storage = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        tied_to = seen.get(storage) if t.numel() else None
        seen.setdefault(storage, key)
        out.append(TorchKey(key, kinds, tuple(t.shape), id(t) in params, tied_to))
    return out


def _nn():
    import torch

    return torch.nn.Module


# --------------------------------------------------------------------------------------- rules

_SAME = "same"
_LINEAR = "linear"  # (out, in) <-> (in, out)
_CONV = "conv"  # (O, I, *k) <-> (*k, I, O)
_DROP = "drop"

# torch class name -> torch attribute -> (NNX attribute, layout). First match along the MRO wins.
RULES: dict[str, dict[str, tuple[str | None, str]]] = {
    "Linear": {"weight": ("kernel", _LINEAR)},
    "_ConvTransposeNd": {},  # its (I, O, *k) weight has no rule: keep its name in the port
    "_ConvNd": {"weight": ("kernel", _CONV)},
    "Embedding": {"weight": ("embedding", _SAME)},
    "LayerNorm": {"weight": ("scale", _SAME)},
    "RMSNorm": {"weight": ("scale", _SAME)},
    "GroupNorm": {"weight": ("scale", _SAME)},
    "_BatchNorm": {
        "weight": ("scale", _SAME),
        "running_mean": ("mean", _SAME),
        "running_var": ("var", _SAME),
        "num_batches_tracked": (None, _DROP),
    },
}


def _to_nnx_layout(x: np.ndarray, layout: str) -> np.ndarray:
    if layout == _LINEAR:
        return x.T
    if layout == _CONV:
        return np.transpose(x, (*range(2, x.ndim), 1, 0))
    return x


def _to_torch_layout(x: np.ndarray, layout: str) -> np.ndarray:
    if layout == _LINEAR:
        return x.T
    if layout == _CONV:
        return np.transpose(x, (x.ndim - 1, x.ndim - 2, *range(x.ndim - 2)))
    return x


def _nnx_shape(shape: tuple, layout: str) -> tuple:
    return tuple(_to_nnx_layout(np.empty(shape, np.int8), layout).shape)


def _rule(kinds: Iterable[str], attr: str) -> tuple[str | None, str] | None:
    for kind in kinds:
        if kind in RULES:
            return RULES[kind].get(attr)
    return None


# ------------------------------------------------------------------------------------- the map


@dataclasses.dataclass(frozen=True)
class Entry:
    """torch key <-> NNX variable path, and the layout rule between them."""

    torch_key: str
    nnx_path: tuple
    layout: str = _SAME


@dataclasses.dataclass
class KeyMap:
    entries: list[Entry]
    tied: dict[str, str] = dataclasses.field(default_factory=dict)  # key -> the key it shares
    dropped: list[str] = dataclasses.field(default_factory=list)  # torch keys a rule drops
    unexpected: list[str] = dataclasses.field(default_factory=list)  # torch keys, no variable
    missing: list[str] = dataclasses.field(default_factory=list)  # NNX variables, no key
    wrong_shapes: list[str] = dataclasses.field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (self.unexpected or self.missing or self.wrong_shapes)

    def report(self) -> str:
        """One line per category that is not empty (the same layout as check_keys)."""
        lines = [f"{len(self.entries)} keys map"]
        if self.tied:
            lines.append(
                f"  tied ({len(self.tied)}): "
                + ", ".join(f"{k} = {v}" for k, v in sorted(self.tied.items()))
            )
        if self.dropped:
            lines.append(f"  dropped by rule ({len(self.dropped)}): " + ", ".join(self.dropped))
        if self.unexpected:
            lines.append(
                f"  unexpected keys ({len(self.unexpected)}): " + ", ".join(self.unexpected)
            )
        if self.missing:
            lines.append(f"  missing keys ({len(self.missing)}): " + ", ".join(self.missing))
        if self.wrong_shapes:
            lines.append(
                f"  wrong shapes ({len(self.wrong_shapes)}):\n    "
                + "\n    ".join(self.wrong_shapes)
            )
        return "\n".join(lines)

    def check(self, source: str = "state_dict") -> KeyMap:
        """Raise parity.state_dict.StateDictError listing every key that does not map."""
        if not self.complete:
            raise StateDictError(f"{source} does not match the model: " + self.report())
        return self

    def load(self, model, state_dict: Mapping) -> None:
        """Write the torch values into the model's variables (torch dtype for floating values,
        the variable's own dtype for integer ones)."""
        import jax.numpy as jnp

        for e in self.entries:
            var = variable_at(model, e.nnx_path)
            value = _to_nnx_layout(to_numpy(state_dict[e.torch_key]), e.layout)
            if not np.issubdtype(value.dtype, np.floating) and value.dtype.name != "bfloat16":
                value = value.astype(var.get_value().dtype)
            var.set_value(jnp.asarray(np.array(value)))  # a copy; 0-d stays 0-d

    def to_torch(self, flat: Mapping[tuple, object]) -> dict[str, np.ndarray]:
        """NNX arrays by path tuple (a model's state, or its gradients) -> torch keys and
        layouts. Tied keys get their partner's array; paths not in `flat` are left out."""
        out = {}
        for e in self.entries:
            if e.nnx_path in flat:
                out[e.torch_key] = _to_torch_layout(to_numpy(flat[e.nnx_path]), e.layout)
        for key, partner in self.tied.items():
            if partner in out:
                out[key] = out[partner]
        return out


def variable_at(model, path: tuple):
    obj = model
    for p in path:
        obj = obj[p] if isinstance(p, int) else getattr(obj, p)
    return obj


def _nnx_variables(model, rename: Rename | None, ignore) -> dict[str, dict[str, tuple]]:
    """torch-form module path -> attribute -> (path tuple, shape)."""
    from flax import nnx

    out: dict[str, dict[str, tuple]] = {}
    for path, var in nnx.iter_graph(model):
        if not isinstance(var, nnx.Variable) or isinstance(var, nnx.RngState):
            continue
        if ignore and dotted(path).endswith(ignore):
            continue
        module = dotted(path[:-1])
        module = rename(module) if (rename and module) else module
        out.setdefault(module, {})[str(path[-1])] = (tuple(path), tuple(var.get_value().shape))
    return out


def build_keymap(
    described: Iterable[TorchKey],
    model,
    *,
    rename: Rename | None = None,
    ignore: Iterable[str] = (),
) -> KeyMap:
    """Match every described torch key to a variable of the NNX `model` by the rules above.
    `ignore`: key / variable-path suffixes left out on both sides."""
    ignore = tuple(ignore)
    described = [tk for tk in described if not (ignore and tk.key.endswith(ignore))]
    variables = _nnx_variables(model, rename, ignore)
    km = KeyMap([])
    used: set[tuple] = set()
    unmatched: list[TorchKey] = []
    for tk in described:
        candidates = variables.get(tk.module, {})
        rule = _rule(tk.kinds, tk.attr)
        if tk.attr in candidates:
            target, layout = tk.attr, _SAME
        elif rule is not None and rule[0] in candidates:
            target, layout = rule
        else:
            if rule is not None and rule[1] == _DROP:
                km.dropped.append(tk.key)
            else:
                unmatched.append(tk)
            continue
        path, shape = candidates[target]
        want = _nnx_shape(tk.shape, layout) if layout == _SAME or len(tk.shape) >= 2 else None
        if want != shape:
            rule_txt = "" if layout == _SAME else f" ({layout} layout {want})"
            km.wrong_shapes.append(
                f"{tk.key}: torch {tk.shape}{rule_txt}, port {dotted(path)} {shape}"
            )
        else:
            km.entries.append(Entry(tk.key, path, layout))
        used.add(path)
    _resolve_ties(km, described, unmatched)
    km.missing = sorted(
        dotted(path)
        for attrs in variables.values()
        for path, _ in attrs.values()
        if path not in used
    )
    return km


def _resolve_ties(km: KeyMap, described: list[TorchKey], unmatched: list[TorchKey]) -> None:
    """An unmatched key that shares storage with a mapped one (either member of the tie) is
    covered by it; any other unmatched key is unexpected."""
    group = {tk.key: tk.tied_to or tk.key for tk in described}
    mapped: dict[str, str] = {}
    for e in km.entries:
        mapped.setdefault(group.get(e.torch_key, e.torch_key), e.torch_key)
    for tk in unmatched:
        partner = mapped.get(group[tk.key])
        if partner is not None:
            km.tied[tk.key] = partner
        else:
            km.unexpected.append(tk.key)


def param_dtype(torch_module) -> str:
    """The dtype of the module's first floating parameter, as a JAX dtype name ("float32",
    "float64"): what a port should be built with, since some NNX modules fix their compute dtype
    when built (nnx.Embed: `dtype or param_dtype`), whatever values are loaded later."""
    for p in torch_module.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return "float32"


def load_torch(
    model,
    torch_module,
    *,
    rename: Rename | None = None,
    ignore: Iterable[str] = (),
    strict: bool = True,
):
    """Give the NNX `model` the weights (and buffers) of `torch_module` by rule; returns the model.
    `strict`: any key that does not map raises StateDictError naming every one of them."""
    km = build_keymap(describe_torch(torch_module), model, rename=rename, ignore=ignore)
    if strict:
        km.check(f"{type(torch_module).__name__} state_dict")
    km.load(model, torch_module.state_dict())
    return model
