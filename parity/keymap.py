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

A rule may also declare the layout of a module's activations in the port where it differs from
torch's (`register_rule(..., layout=CHANNELS_LAST)`: flax's convolutions and norms on
(N, *spatial, C) where torch's are (N, C, *spatial)). The diff compares an input or output whose
shape differs from torch's only through the layout declared for its module class; any other
shape fails (parity/check.py). The conv family's built-in rules declare CHANNELS_LAST.

The torch side is described once (`describe_torch`: key, module classes, shape, parameter or
buffer, tie) as plain data, so a map can be built, and goldens loaded, without torch.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from parity.capture import Rename, dotted
from parity.state_dict import StateDictError, to_numpy


@dataclasses.dataclass(frozen=True)
class TorchKey:
    """One state_dict entry: its key, the class names of its module (the class first, then its
    bases up to torch.nn.Module), its shape, parameter or buffer, the earlier key it shares
    storage with (tied weights), if any, and the modules that enclose its module (path and class
    names, the model first), whose rules may claim the key (nn.MultiheadAttention claims
    `out_proj.weight`)."""

    key: str
    kinds: tuple[str, ...]
    shape: tuple[int, ...]
    parameter: bool = True
    tied_to: str | None = None
    outer: tuple[tuple[str, tuple[str, ...]], ...] = ()

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
        outer = tuple((path, tuple(kinds)) for path, kinds in d.get("outer", ()))
        return cls(
            d["key"], tuple(d["kinds"]), tuple(d["shape"]), d["parameter"], d["tied_to"], outer
        )


def describe_torch(module) -> list[TorchKey]:
    """Every state_dict key of a torch module, in state_dict order, as a TorchKey."""
    params = {id(p) for p in module.parameters()}
    kinds_of = {path: _kinds(m) for path, m in module.named_modules(remove_duplicate=False)}
    seen: dict[tuple, str] = {}
    out = []
    for key, t in module.state_dict(keep_vars=True).items():
        owner = key.rpartition(".")[0]
        parts = owner.split(".") if owner else []
        enclosing = ["", *(".".join(parts[:i]) for i in range(1, len(parts)))] if parts else []
        outer = tuple((p, kinds_of[p]) for p in enclosing)
        storage = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        tied_to = seen.get(storage) if t.numel() else None
        seen.setdefault(storage, key)
        shape = tuple(t.shape)
        out.append(TorchKey(key, kinds_of[owner], shape, id(t) in params, tied_to, outer))
    return out


def _kinds(m) -> tuple[str, ...]:
    mro = type(m).__mro__
    return tuple(c.__name__ for c in mro[: mro.index(_nn())])


def _nn():
    import torch

    return torch.nn.Module


# ------------------------------------------------------------------------------------- layouts


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a torch tensor (or one chunk of it) becomes an NNX variable's value, and back: a
    permutation of its axes (`to_nnx`, and its inverse `to_torch`), then, with `reshape`, a
    reshape into the shape of the port's variable (a head split: (E, E) -> (E, heads, head_dim)).
    Every layout is a permutation or a reshape, so the round trip is EXACT."""

    name: str
    to_nnx: Callable[[np.ndarray], np.ndarray]
    to_torch: Callable[[np.ndarray], np.ndarray]
    reshape: bool = False


def _reverse_last_two(x: np.ndarray) -> np.ndarray:
    return x.T if x.ndim == 2 else x


def _kernel_last(x: np.ndarray) -> np.ndarray:  # (O, I, *k) -> (*k, I, O)
    return np.transpose(x, (*range(2, x.ndim), 1, 0))


def _kernel_first(x: np.ndarray) -> np.ndarray:  # (*k, I, O) -> (O, I, *k)
    return np.transpose(x, (x.ndim - 1, x.ndim - 2, *range(x.ndim - 2)))


def _same(x: np.ndarray) -> np.ndarray:
    return x


SAME = Layout("same", _same, _same)
LINEAR = Layout("linear", _reverse_last_two, _reverse_last_two)  # (out, in) <-> (in, out)
# (O, I, *k) <-> (*k, I, O); a ConvTranspose weight (I, O, *k) becomes (*k, O, I), the kernel of
# nnx.ConvTranspose(transpose_kernel=True)
CONV = Layout("conv", _kernel_last, _kernel_first)
LINEAR_HEADS = Layout("linear+heads", _reverse_last_two, _reverse_last_two, reshape=True)
SAME_HEADS = Layout("same+heads", _same, _same, reshape=True)


def _splits(shape: tuple, into: tuple) -> bool:
    """Whether `into` is `shape` with some axes split into several (E -> (heads, head_dim))."""
    i, prod = 0, 1
    for n in into:
        prod *= n
        if i >= len(shape) or prod > shape[i] or shape[i] % prod:
            return False
        if prod == shape[i]:
            i, prod = i + 1, 1
    return i == len(shape) and prod == 1


# -------------------------------------------------------------------------- activation layouts


@dataclasses.dataclass(frozen=True)
class ActivationLayout:
    """How a port lays out a module's inputs and outputs where torch's shape differs: `to_torch`
    gives the port's array in torch's layout (a permutation or a reshape: no value changes), or
    None when the array's shape is not torch's in this layout. `reread`, where given, reads an
    array whose shape equals torch's in this layout anyway (channels-last on a map whose channel
    count equals every spatial size: the shapes cannot tell the layouts apart)."""

    name: str
    port: str  # the port's layout, in words
    to_torch: Callable[[np.ndarray, tuple], np.ndarray | None]
    reread: Callable[[np.ndarray], np.ndarray] | None = None


def _from_channels_last(x, torch_shape: tuple):
    t = tuple(torch_shape)
    if len(t) >= 3 and tuple(np.shape(x)) == (t[0], *t[2:], t[1]):
        return np.moveaxis(np.asarray(x), -1, 1)
    return None


def _channels_last_reread(x):
    return np.moveaxis(np.asarray(x), -1, 1)


def _merge_heads(x, torch_shape: tuple):
    s, t = tuple(np.shape(x)), tuple(torch_shape)
    if len(s) == len(t) + 1 and len(t) >= 1 and s[:-2] == t[:-1] and s[-2] * s[-1] == t[-1]:
        return np.reshape(np.asarray(x), t)
    return None


# flax's convolutions, GroupNorm and BatchNorm on (N, *spatial, C); torch's on (N, C, *spatial)
CHANNELS_LAST = ActivationLayout(
    "channels-last",
    "(N, *spatial, C) for torch's (N, C, *spatial)",
    _from_channels_last,
    _channels_last_reread,
)
# heads on their own axis: an nnx.LinearGeneral projection (LINEAR_HEADS weights) gives
# (..., heads, head_dim) where torch's Linear gives (..., heads * head_dim), head-major
HEADS = ActivationLayout(
    "heads", "(..., heads, head_dim) for torch's (..., heads * head_dim)", _merge_heads
)

# torch class name -> {module path relative to a module of that class ("" itself): its layout}
LAYOUTS: dict[str, dict[str, ActivationLayout]] = {}


def module_kinds(torch_module) -> dict[str, tuple[str, ...]]:
    """Every module path of a torch module ("" the module itself) -> its class names, the class
    first, then its bases up to torch.nn.Module (what rules and layouts are matched by)."""
    return {p: _kinds(m) for p, m in torch_module.named_modules(remove_duplicate=False)}


def declared_layouts(
    kinds: Mapping[str, Sequence[str]],
) -> dict[str, tuple[ActivationLayout, str]]:
    """module path -> (its declared activation layout, the torch class whose rule declares it),
    for the modules that have one. As with the weights, the declaration of an enclosing module
    is tried before its submodules' own."""
    out = {}
    for path in kinds:
        parts = path.split(".") if path else []
        scopes = ["", *(".".join(parts[:i]) for i in range(1, len(parts) + 1))] if parts else [""]
        for scope in scopes:
            owner = next((k for k in kinds.get(scope, ()) if k in LAYOUTS), None)
            rel = path[len(scope) + 1 :] if scope else path
            if owner is not None and rel in LAYOUTS[owner]:
                out[path] = (LAYOUTS[owner][rel], owner)
                break
    return out


# --------------------------------------------------------------------------------------- rules


@dataclasses.dataclass(frozen=True)
class To:
    """Where a torch tensor goes: the NNX variable at `path` (dotted, relative to the module the
    rule is for: `kernel`, `out.kernel`, `layers.0.cell.dense_i.kernel`), in `layout`. With
    `chunks` > 1, only slice `chunk` of `chunks` equal slices along torch's first axis goes there
    (a packed q/k/v projection, an LSTM's four gates)."""

    path: str
    layout: Layout = SAME
    chunk: int = 0
    chunks: int = 1


# A rule: {torch attribute: To, a list of To (the slices), or () (dropped: no NNX counterpart)},
# or a function (name, has) -> the same or None, where `name` is the key relative to the module
# (`weight`, `out_proj.weight`, `weight_ih_l1_reverse`) and has(path) tells whether the port
# holds a variable at that relative path.
Rule = Mapping[str, "To | Sequence[To]"] | Callable[[str, Callable[[str], bool]], object]

RULES: dict[str, Rule] = {}


def register_rule(
    torch_class: str | type,
    rule: Rule | None = None,
    *,
    layout: ActivationLayout | Mapping[str, ActivationLayout] | None = None,
) -> None:
    """Map the state_dict keys of a torch module class (matched by class name along the MRO of
    each key's module, the first registered name wins) by `rule`. The rule of an enclosing
    module is tried before its submodules' rules. Registering a name again replaces its rule.

    `layout` declares how the port lays out the activations of a module of this class (an
    ActivationLayout), or of its submodules (`{"q_proj": HEADS, "": CHANNELS_LAST}`, paths
    relative to it); the diff compares no other shape than torch's. Registering a layout again
    replaces it; `rule=None` registers a layout alone."""
    name = torch_class if isinstance(torch_class, str) else torch_class.__name__
    if rule is not None:
        RULES[name] = rule
    if layout is not None:
        LAYOUTS[name] = dict(layout) if isinstance(layout, Mapping) else {"": layout}


def _rule_targets(rule: Rule, name: str, has: Callable[[str], bool]) -> tuple[To, ...] | None:
    found = rule(name, has) if callable(rule) else rule.get(name)
    if found is None:
        return None
    return (found,) if isinstance(found, To) else tuple(found)


def _find_rule(kinds: Sequence[str]) -> Rule | None:
    return next((RULES[k] for k in kinds if k in RULES), None)


register_rule("Linear", {"weight": To("kernel", LINEAR)})
# Conv1d/2d/3d, ConvTranspose1d/2d/3d: nnx.Conv and nnx.ConvTranspose work channels-last
register_rule("_ConvNd", {"weight": To("kernel", CONV)}, layout=CHANNELS_LAST)
register_rule("Embedding", {"weight": To("embedding")})
for _norm in ("LayerNorm", "RMSNorm"):
    register_rule(_norm, {"weight": To("scale")})
register_rule("GroupNorm", {"weight": To("scale")}, layout=CHANNELS_LAST)
register_rule(
    "_BatchNorm",
    {
        "weight": To("scale"),
        "running_mean": To("mean"),
        "running_var": To("var"),
        "num_batches_tracked": (),
    },
    layout=CHANNELS_LAST,
)


def _mha_rule(name: str, has) -> object:
    """nn.MultiheadAttention -> nnx.MultiHeadAttention: the packed in_proj (3E, E) in thirds to
    query / key / value (E, heads, head_dim); out_proj (E, E) to out (heads, head_dim, E)."""
    qkv = ("query", "key", "value")
    if name == "in_proj_weight":
        return [To(f"{p}.kernel", LINEAR_HEADS, i, 3) for i, p in enumerate(qkv)]
    if name == "in_proj_bias":
        return [To(f"{p}.bias", SAME_HEADS, i, 3) for i, p in enumerate(qkv)]
    if name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):  # kdim / vdim != embed_dim
        return To(f"{qkv['qkv'.index(name[0])]}.kernel", LINEAR_HEADS)
    if name == "out_proj.weight":
        return To("out.kernel", LINEAR_HEADS)
    if name == "out_proj.bias":
        return To("out.bias")
    return None


register_rule("MultiheadAttention", _mha_rule)

_RNN_KEY = re.compile(r"(weight|bias)_(ih|hh)_l(\d+)(_reverse)?")
_GATES = {"LSTM": (("ii", "if_", "ig", "io"), ("hi", "hf", "hg", "ho"))}


def _recurrent_rule(torch_class: str):
    """nn.LSTM / nn.GRU / nn.RNN -> flax's cells under nnx.RNN (parity.layers.LSTM, GRU, RNN): layer
    k's cell at `layers.k.cell` (bidirectional: `layers.k.forward_rnn.cell`,
    `layers.k.backward_rnn.cell`). Cells with one projection per side (OptimizedLSTMCell,
    GRUCell, SimpleCell: `dense_i`, `dense_h`) take torch's (G*H, in) matrices whole, the gates
    already in torch's order (LSTM i, f, g, o; GRU r, z, n); flax's LSTMCell takes them in four
    slices, gate by gate (`ii`, `if_`, `ig`, `io`; `hi`, ...)."""

    def rule(name: str, has) -> object:
        m = _RNN_KEY.fullmatch(name)
        if m is None:
            return None
        kind, side, layer, reverse = m.groups()
        cell = f"layers.{layer}.cell"
        if (
            reverse
            or has(f"layers.{layer}.forward_rnn.cell.dense_i.kernel")
            or has(f"layers.{layer}.forward_rnn.cell.ii.kernel")
        ):
            cell = f"layers.{layer}.{'backward_rnn' if reverse else 'forward_rnn'}.cell"
        attr, layout = ("kernel", LINEAR) if kind == "weight" else ("bias", SAME)
        if torch_class in _GATES and has(f"{cell}.ii.kernel"):
            gates = _GATES[torch_class][side == "hh"]
            return [To(f"{cell}.{g}.{attr}", layout, i, 4) for i, g in enumerate(gates)]
        return To(f"{cell}.dense_{side[0]}.{attr}", layout)

    return rule


for _rnn in ("LSTM", "GRU", "RNN"):
    register_rule(_rnn, _recurrent_rule(_rnn))


# ------------------------------------------------------------------------------------- the map


@dataclasses.dataclass(frozen=True)
class Entry:
    """torch key (or slice `chunk` of `chunks` along its first axis) <-> NNX variable path, the
    layout between them, and the torch-side shape after the permutation (for a reshape)."""

    torch_key: str
    nnx_path: tuple
    layout: Layout = SAME
    chunk: int = 0
    chunks: int = 1
    permuted: tuple = ()


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
        lines = [f"{len({e.torch_key for e in self.entries})} keys map"]
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

    def load(self, model, state_dict: Mapping, *, device: bool = True) -> None:
        """Write the torch values into the model's variables (torch dtype for floating values,
        the variable's own dtype for integer ones). `device=False` leaves them numpy arrays
        (C-contiguous copies): no device transfer, and no XLA program compiled per new shape,
        which jnp.asarray costs (a converter that builds many models)."""
        import jax.numpy as jnp

        for e in self.entries:
            var = variable_at(model, e.nnx_path)
            value = _to_nnx(to_numpy(state_dict[e.torch_key]), e, var.get_value().shape)
            if not np.issubdtype(value.dtype, np.floating) and value.dtype.name != "bfloat16":
                value = value.astype(var.get_value().dtype)
            value = np.array(value, order="C")  # a copy; 0-d stays 0-d
            var.set_value(jnp.asarray(value) if device else value)

    def to_torch(self, flat: Mapping[tuple, object]) -> dict[str, np.ndarray]:
        """NNX arrays by path tuple (a model's state, or its gradients) -> torch keys and
        layouts. Tied keys get their partner's array; keys with a path not in `flat` are left
        out."""
        parts: dict[str, dict[int, np.ndarray]] = {}
        chunks: dict[str, int] = {}
        for e in self.entries:
            if e.nnx_path in flat:
                y = to_numpy(flat[e.nnx_path])
                y = y.reshape(e.permuted) if e.layout.reshape else y
                parts.setdefault(e.torch_key, {})[e.chunk] = e.layout.to_torch(y)
                chunks[e.torch_key] = e.chunks
        out = {}
        for key, got in parts.items():
            if len(got) == chunks[key]:
                out[key] = (
                    got[0]
                    if chunks[key] == 1
                    else np.concatenate([got[i] for i in range(chunks[key])], axis=0)
                )
        for key, partner in self.tied.items():
            if partner in out:
                out[key] = out[partner]
        return out


def _chunk(x: np.ndarray, chunk: int, chunks: int) -> np.ndarray:
    return x if chunks == 1 else np.split(x, chunks, axis=0)[chunk]


def _to_nnx(x: np.ndarray, e: Entry, shape: tuple) -> np.ndarray:
    y = e.layout.to_nnx(_chunk(x, e.chunk, e.chunks))
    return y.reshape(shape) if e.layout.reshape else y


def variable_at(model, path: tuple):
    obj = model
    for p in path:
        obj = obj[p] if isinstance(p, int) else getattr(obj, p)
    return obj


def _nnx_variables(model, rename: Rename | None, ignore) -> dict[str, tuple]:
    """torch-form dotted path of every variable (`rename` applied to its module) -> (path tuple,
    shape)."""
    from flax import nnx

    out: dict[str, tuple] = {}
    for path, var in nnx.iter_graph(model):
        if not isinstance(var, nnx.Variable) or isinstance(var, nnx.RngState):
            continue
        if ignore and dotted(path).endswith(ignore):
            continue
        module = dotted(path[:-1])
        module = rename(module) if (rename and module) else module
        name = f"{module}.{path[-1]}" if module else str(path[-1])
        out[name] = (tuple(path), tuple(var.get_value().shape))
    return out


def _scopes(tk: TorchKey) -> list[tuple[str, tuple[str, ...]]]:
    """The modules whose rules may claim `tk`, outermost first: those enclosing its module, then
    its module."""
    return [*tk.outer, (tk.module, tk.kinds)]


def _join(scope: str, rel: str) -> str:
    return f"{scope}.{rel}" if scope else rel


def _match(tk: TorchKey, variables: dict[str, tuple]) -> tuple[str, tuple[To, ...]] | None:
    """(the scope, its targets) of the first rule, outermost first, whose targets the port holds;
    () targets: a rule drops the key; None: no rule applies."""
    if tk.key in variables:
        return "", (To(tk.key),)
    dropped = None
    for scope, kinds in _scopes(tk):
        rule = _find_rule(kinds)
        if rule is None:
            continue
        rel = tk.key[len(scope) + 1 :] if scope else tk.key
        targets = _rule_targets(rule, rel, lambda p, s=scope: _join(s, p) in variables)
        if targets is None:
            continue
        if not targets:
            dropped = (scope, ())
        elif all(_join(scope, t.path) in variables for t in targets):
            return scope, targets
    return dropped


def _entry(tk: TorchKey, target: To, path: tuple, shape: tuple) -> tuple[Entry | None, str]:
    """The entry for one target, or a wrong-shape line."""
    torch_shape = list(tk.shape)
    if target.chunks > 1:
        torch_shape[0] //= target.chunks
    permuted = tuple(target.layout.to_nnx(np.empty(torch_shape, np.int8)).shape)
    fits = _splits(permuted, shape) if target.layout.reshape else permuted == shape
    if not fits or (target.chunks > 1 and tk.shape[0] % target.chunks):
        how = f"{target.layout.name} layout {permuted}" if target.layout is not SAME else ""
        if target.chunks > 1:
            how = f"slice {target.chunk + 1}/{target.chunks}" + (f", {how}" if how else "")
        return (
            None,
            f"{tk.key}: torch {tk.shape}{f' ({how})' if how else ''}, port {dotted(path)} {shape}",
        )
    return Entry(tk.key, path, target.layout, target.chunk, target.chunks, permuted), ""


def build_keymap(
    described: Iterable[TorchKey],
    model,
    *,
    rename: Rename | None = None,
    ignore: Iterable[str] = (),
) -> KeyMap:
    """Match every described torch key to the variables of the NNX `model` by the rules above.
    `ignore`: key / variable-path suffixes left out on both sides."""
    ignore = tuple(ignore)
    described = [tk for tk in described if not (ignore and tk.key.endswith(ignore))]
    variables = _nnx_variables(model, rename, ignore)
    km = KeyMap([])
    used: set[tuple] = set()
    unmatched: list[TorchKey] = []
    for tk in described:
        found = _match(tk, variables)
        if found is None:
            unmatched.append(tk)
            continue
        scope, targets = found
        if not targets:
            km.dropped.append(tk.key)
        for target in targets:
            path, shape = variables[_join(scope, target.path)]
            entry, wrong = _entry(tk, target, path, shape)
            if entry is None:
                km.wrong_shapes.append(wrong)
            else:
                km.entries.append(entry)
            used.add(path)
    _resolve_ties(km, described, unmatched)
    # named as torch would name them (`rename` applied): the keys the port expected
    km.missing = sorted(name for name, (path, _) in variables.items() if path not in used)
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
