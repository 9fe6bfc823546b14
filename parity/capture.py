"""Record what every module of a model computes, on the torch side and on the Flax NNX side.

Both sides name a module by its torch dotted path (`blocks.1.norm`; "" is the model itself), so
the two records pair up by name. An NNX port whose attribute names mirror the torch module's gets
the same paths by rule: attribute names and list indices joined with dots (`rename` covers a port
that flattens or renames a container).

- torch: forward hooks on every submodule (`torch_hooks`);
- NNX: each module class's `__call__` is intercepted for the duration of one call, from the
  outside (`nnx_hooks`): the model code carries no instrumentation, and the interception works
  eagerly and inside `nnx.jit` / `nnx.grad` (it is set up on the model object the transform
  passes in).

A record is a `Call`: the module path, the method, which call of that module it was (a module can
run several times per forward: a shared layer, a recurrent cell), and the array leaves of its
arguments and of its output. Calls are listed in the order they returned (children before their
parent), the same order on both sides when the port calls its modules as the reference does.

`capture_torch` / `capture_nnx` run a model once and return a `Capture`: the calls, the output,
and on request the gradient of every parameter under a seeded cotangent loss
(sum(output * R), R a fixed random array per output: every element of the output gets a
different weight, so no gradient cancels by symmetry), and the state after the call (buffers
such as BatchNorm running statistics).

Nothing here imports torch at module level: an NNX-only capture (checking committed goldens)
runs without it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

Select = Callable[[str], bool]
Rename = Callable[[str], str]


@dataclasses.dataclass
class Call:
    """One call of one module: `path` (torch dotted form, "" = the model), `method` ("forward"
    for a module call, else the name of a captured method), `index` (0 = its first call in this
    run), the array leaves of the arguments (positional, then keyword by name) and of the
    output."""

    path: str
    method: str
    index: int
    args: list
    outputs: list

    @property
    def key(self) -> tuple[str, str, int]:
        return self.path, self.method, self.index


@dataclasses.dataclass
class Capture:
    """One run of a model: its calls in return order, the leaves of its output, and (on request)
    the cotangent loss, the gradient of every parameter and the state after the call, each keyed
    by the side's own names (torch: state_dict keys; NNX: variable path tuples)."""

    calls: list[Call]
    outputs: list
    loss: object = None
    grads: dict | None = None
    state: dict | None = None


def dotted(path: Iterable) -> str:
    """An NNX path tuple (`('blocks', 1, 'norm')`) in torch's dotted form (`blocks.1.norm`)."""
    return ".".join(str(p) for p in path)


def prefix_rename(prefixes: Mapping[str, str]) -> Rename:
    """A `rename` that rewrites the longest matching NNX path prefix (whole components only):
    `{"h": "transformer.h"}` maps `h.0.attn` to `transformer.h.0.attn`; the empty prefix matches
    every path, so `{"": "transformer"}` puts every submodule under `transformer.`. The model
    itself ("") is never renamed."""
    items = sorted(prefixes.items(), key=lambda kv: -len(kv[0]))

    def rename(path: str) -> str:
        for old, new in items:
            if old == "":
                return f"{new}.{path}" if new else path
            if path == old or path.startswith(old + "."):
                return new + path[len(old) :]
        return path

    return rename


# ---------------------------------------------------------------------------------------- leaves


def _torch_tensors(obj) -> list:
    """The tensors inside nested tuples / lists / dicts (dicts by sorted key, as jax.tree does)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        return [x for k in sorted(obj) for x in _torch_tensors(obj[k])]
    if isinstance(obj, (tuple, list)):
        return [x for item in obj for x in _torch_tensors(item)]
    return []


def _torch_leaves(obj) -> list:
    """_torch_tensors detached and cloned: an in-place op later in the forward (a ReLU with
    inplace=True) must not change what was recorded."""
    return [t.detach().clone() for t in _torch_tensors(obj)]


def _jax_leaves(obj) -> list:
    """The array leaves of a pytree (None and Python scalars are not arrays: dropped)."""
    import jax

    return [x for x in jax.tree.leaves(obj) if isinstance(x, (jax.Array, np.ndarray))]


def _args_leaves(leaves_of, args, kwargs) -> list:
    return leaves_of(tuple(args)) + [x for k in sorted(kwargs) for x in leaves_of(kwargs[k])]


class _Recorder:
    """Numbers the calls of each (path, method) and keeps them in return order."""

    def __init__(self):
        self.calls: list[Call] = []
        self._counts: collections.Counter = collections.Counter()

    def add(self, path: str, method: str, args: list, outputs: list) -> None:
        index = self._counts[path, method]
        self._counts[path, method] += 1
        self.calls.append(Call(path, method, index, args, outputs))


# ----------------------------------------------------------------------------------------- torch


@contextlib.contextmanager
def torch_hooks(
    module, *, select: Select | None = None, methods: Sequence[str] = ()
) -> Iterator[list[Call]]:
    """Record every call of `module` and its submodules (those whose dotted path `select`
    accepts; all by default) while the block runs; yields the list the calls go into.

    `methods`: also record these methods of any selected module that has them (an instance
    attribute wraps the bound method for the block: torch looks it up before the class)."""
    rec = _Recorder()
    handles, patched = [], []
    running: list[str] = []  # the calls under way, innermost last: where an exception started

    def enter(path, _module, _args):
        running.append(path)

    def hook(path, _module, args, kwargs, output):
        running.pop()
        rec.add(path, "forward", _args_leaves(_torch_leaves, args, kwargs), _torch_leaves(output))

    def wrap(path, name, bound):
        @functools.wraps(bound)
        def spy(*args, **kwargs):
            out = bound(*args, **kwargs)
            rec.add(path, name, _args_leaves(_torch_leaves, args, kwargs), _torch_leaves(out))
            return out

        return spy

    try:
        for path, m in module.named_modules():
            if select is not None and not select(path):
                continue
            handles.append(m.register_forward_pre_hook(functools.partial(enter, path)))
            handles.append(m.register_forward_hook(functools.partial(hook, path), with_kwargs=True))
            for name in methods:
                if callable(getattr(m, name, None)):
                    setattr(m, name, wrap(path, name, getattr(m, name)))
                    patched.append((m, name))
        yield rec.calls
    except Exception as e:
        mark_module(e, running[-1] if running else "")
        raise
    finally:
        for h in handles:
            h.remove()
        for m, name in patched:
            delattr(m, name)


def cotangents(outputs: Sequence, seed: int = 0) -> list[np.ndarray]:
    """One fixed float64 normal array per floating output leaf (integer leaves get None): the
    weights of the cotangent loss sum_i sum(output_i * R_i). The same seed gives the same arrays
    on both sides."""
    out = []
    for i, leaf in enumerate(outputs):
        dtype = str(getattr(leaf, "dtype", ""))
        floating = any(s in dtype for s in ("float", "bfloat"))
        shape = tuple(leaf.shape)
        out.append(np.random.default_rng([seed, i]).normal(size=shape) if floating else None)
    return out


def torch_cotangent_loss(output, seed: int = 0):
    """sum_i sum(output_i * R_i) over the floating tensors of a torch output (see cotangents)."""
    import torch

    leaves = _torch_tensors(output)
    loss = None
    for leaf, r in zip(leaves, cotangents(leaves, seed)):
        if r is None:
            continue
        term = (leaf * torch.from_numpy(r).to(leaf.dtype)).sum()
        loss = term if loss is None else loss + term
    if loss is None:
        raise ValueError("the model's output has no floating tensor to differentiate")
    return loss


def capture_torch(
    module,
    args: Sequence = (),
    kwargs: Mapping | None = None,
    *,
    grads: bool = False,
    select: Select | None = None,
    methods: Sequence[str] = (),
    context: contextlib.AbstractContextManager | None = None,
    seed: int = 0,
) -> Capture:
    """Run `module(*args, **kwargs)` once with every module call recorded.

    Autograd stays on even without `grads`, so a forward-only capture runs the same torch
    kernels as one with gradients (with autograd off, nn.MultiheadAttention in eval mode may take
    its fused inference kernel, 6e-7 away in float32). `context` wraps the call (e.g.
    `torch.autocast("cpu", dtype=torch.bfloat16)`). With `grads`, the gradient of every
    parameter under the seeded cotangent loss, keyed by `named_parameters()` name."""
    import torch

    kwargs = dict(kwargs or {})
    if grads:
        module.zero_grad(set_to_none=True)
    with torch_hooks(module, select=select, methods=methods) as calls:
        with torch.enable_grad(), context or contextlib.nullcontext():
            out = module(*args, **kwargs)
            loss = torch_cotangent_loss(out, seed) if grads else None
        if grads:
            loss.backward()
    g = None
    if grads:
        g = {k: p.grad.detach().clone() for k, p in module.named_parameters() if p.grad is not None}
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return Capture(
        list(calls),
        _torch_leaves(out),
        None if loss is None else loss.detach(),
        g,
        state,
    )


# ------------------------------------------------------------------------------------------- NNX


def _defining_class(cls: type, name: str) -> type | None:
    return next((k for k in cls.__mro__ if name in k.__dict__), None)


@contextlib.contextmanager
def nnx_hooks(
    model,
    *,
    select: Select | None = None,
    methods: Sequence[str] = (),
    rename: Rename | None = None,
) -> Iterator[list[Call]]:
    """Record every call of the NNX `model` and of its submodules while the block runs; yields the
    list the calls go into. Paths are torch's dotted form (`rename` applied; `select` sees the
    renamed path).

    Python looks `__call__` up on the class, so the class that defines it (for each module in
    the tree) gets a wrapper for the duration of the block; the wrapper records only the
    instances of this model, by object identity, and a re-entrant call of the same instance
    (a subclass calling super().__call__) once. `methods` are wrapped the same way. Inside
    `nnx.jit` open this on the model the jitted function receives: the recorded leaves are then
    that trace's values, which the function must return."""
    paths: dict[int, str] = {}
    for path, m in _iter_modules(model):
        p = dotted(path)
        p = rename(p) if (rename and p) else p
        if select is None or select(p):
            paths[id(m)] = p
    rec = _Recorder()
    active: set = set()
    originals: dict[tuple[type, str], object] = {}

    def wrap(name, orig):
        @functools.wraps(orig)
        def wrapper(self, *args, **kwargs):
            path, key = paths.get(id(self)), (id(self), name)
            if path is None or key in active:
                return orig(self, *args, **kwargs)
            active.add(key)
            try:
                out = orig(self, *args, **kwargs)
            except Exception as e:
                mark_module(e, path)
                raise
            finally:
                active.discard(key)
            method = "forward" if name == "__call__" else name
            rec.add(path, method, _args_leaves(_jax_leaves, args, kwargs), _jax_leaves(out))
            return out

        return wrapper

    objects = {id(m): m for _, m in _iter_modules(model)}
    for obj_id in paths:
        cls = type(objects[obj_id])
        for name in ("__call__", *methods):
            owner = _defining_class(cls, name)
            if owner is None or owner is object or (owner, name) in originals:
                continue
            originals[owner, name] = owner.__dict__[name]
    try:
        for (owner, name), orig in originals.items():
            setattr(owner, name, wrap(name, orig))
        yield rec.calls
    finally:
        for (owner, name), orig in originals.items():
            setattr(owner, name, orig)


def _iter_modules(model):
    from flax import nnx

    return nnx.iter_modules(model)


def split_static(tree) -> tuple[list, Callable[[Sequence], object]]:
    """(the array leaves of a pytree of arguments: a tuple, `(args, kwargs)`, nested tuples,
    lists and dicts; a function that puts arrays back among the other leaves and rebuilds the
    tree). Under jit only arrays may be traced: a Python flag (need_weights=True,
    use_cache=False) must stay a constant."""
    import jax

    leaves, treedef = jax.tree.flatten(tree)
    positions = [i for i, a in enumerate(leaves) if isinstance(a, np.ndarray) or _is_jax(a)]

    def merge(arrays: Sequence):
        full = list(leaves)
        for i, a in zip(positions, arrays, strict=True):
            full[i] = a
        return jax.tree.unflatten(treedef, full)

    return [leaves[i] for i in positions], merge


def mark_module(error: BaseException, path: str) -> None:
    """Record on an exception the module call it started in (torch's dotted path; the innermost
    call marks it first, enclosing calls leave it): `failed_in(error)` reads it back."""
    if not hasattr(error, "parity_module"):
        try:
            error.parity_module = path
        except AttributeError:  # an exception type without a __dict__
            pass


def failed_in(error: BaseException) -> str | None:
    """The module path an exception started in (mark_module), or None when no capture saw it."""
    return getattr(error, "parity_module", None)


def _is_jax(x) -> bool:
    import jax

    return isinstance(x, jax.Array)


def nnx_cotangent_loss(output, seed: int = 0):
    """The JAX twin of torch_cotangent_loss: the same R arrays (same seed), the same sum."""
    import jax.numpy as jnp

    leaves = _jax_leaves(output)
    terms = [
        jnp.sum(leaf * jnp.asarray(r, leaf.dtype))
        for leaf, r in zip(leaves, cotangents(leaves, seed))
        if r is not None
    ]
    if not terms:
        raise ValueError("the model's output has no floating array to differentiate")
    return functools.reduce(lambda a, b: a + b, terms)


def nnx_state(model) -> dict[tuple, object]:
    """Every Variable of an NNX model except RNG state, by path tuple, as its current value."""
    from flax import nnx

    return {
        tuple(path): var.get_value()
        for path, var in nnx.iter_graph(model)
        if isinstance(var, nnx.Variable) and not isinstance(var, nnx.RngState)
    }


def capture_nnx(
    model,
    args: Sequence = (),
    kwargs: Mapping | None = None,
    *,
    grads: bool = False,
    jit: bool = False,
    select: Select | None = None,
    methods: Sequence[str] = (),
    rename: Rename | None = None,
    seed: int = 0,
) -> Capture:
    """Run the NNX `model(*args, **kwargs)` once with every module call recorded (the model's
    state, e.g. BatchNorm statistics, is updated as by any call).

    Eager by default: op-by-op, like torch eager. `jit=True` runs the call as one compiled
    program (XLA may fuse and round differently). With `grads`, the gradient of every nnx.Param
    under the seeded cotangent loss (the same R as torch_cotangent_loss), keyed by path tuple."""
    from flax import nnx

    meta: list[tuple[str, str, int]] = []
    # nested arguments too (a (cos, sin) pair, a dict of masks): arrays traced, the rest constant
    arrays, merge = split_static((tuple(args), dict(kwargs or {})))

    def run(model, arrays):
        args, kwargs = merge(arrays)
        with nnx_hooks(model, select=select, methods=methods, rename=rename) as calls:
            out = model(*args, **kwargs)
        meta[:] = [c.key for c in calls]
        return out, [(c.args, c.outputs) for c in calls]

    if grads:

        def loss_fn(model, arrays):
            out, records = run(model, arrays)
            return nnx_cotangent_loss(out, seed), (out, records)

        fn = nnx.value_and_grad(loss_fn, has_aux=True)
        if jit:
            fn = nnx.jit(fn)
        (loss, (out, records)), g = fn(model, arrays)
        g = {tuple(path): v.get_value() for path, v in nnx.to_flat_state(g)}
    else:
        fn = nnx.jit(run) if jit else run
        (out, records), loss, g = fn(model, arrays), None, None
    calls = [Call(p, m, i, a, o) for (p, m, i), (a, o) in zip(meta, records, strict=True)]
    return Capture(calls, _jax_leaves(out), loss, g, nnx_state(model))
