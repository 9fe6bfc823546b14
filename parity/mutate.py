"""`python -m parity mutate SPEC [--grads] [--jit]`: break a port on purpose and check that the
diff fails it and names the module that was broken.

A mutant is the port built by its NNX_FACTORY with one change applied from the outside, at one
module (its torch dotted path, as the diff names it): its output transposed, its bias loaded but
not added, its epsilon times 10, a function it calls swapped for a wrong one, ... (KINDS). Each
runs through `parity.diff.diff` in the dtype said to catch it; the mutant is killed when the
diff fails, and named when the first divergent module is the one expected (the mutated module,
or where the change first shows: the enclosing module with a torch counterpart).

SPEC is `package.module:name`, a `Spec` (or a callable returning one): the two factories, one
row per mutant, and every kind that does not apply to the port with the reason (no attention,
no norm, ...): a kind is never skipped in silence. A mutant that survives in every dtype is a
finding: the row says so (`finding`), with the dtype that would catch it, if any.

Exit status: 0 when the unmutated port passes in every dtype used and every mutant is killed and
named as expected (or survives as its finding says); 1 otherwise; 2 for a bad SPEC (one line); 3
when the unmutated port's run itself fails (one line, as `python -m parity diff`'s).

Mechanisms, none of which edits the port's source:

- outputs: the module's class is swapped, on that one instance, for a subclass whose `__call__`
  changes what the module returns (the graph keeps the subclass, so the change holds under
  `nnx.jit` and `nnx.grad`, and the diff's hooks record the changed output);
- attributes: a module attribute the port reads when called (`epsilon`, `rope_theta`);
- functions: while the module runs, a function it looks up when called (`jax.nn.gelu`,
  `jnp.tril`, a cast helper of the port's own module) is replaced;
- weights: two variables (or two slices of one) exchanged after loading.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence

KINDS = {
    "transpose_output": "the module's output with its last two axes swapped",
    "permute_axes": "an output's axes in another order (attention weights (B, T, S, H) for (B, H, T, S))",
    "drop_position": "an output without its last position along one axis",
    "permute_heads": "the heads of a projection's output rolled by one",
    "drop_bias": "the bias loaded but not added",
    "eps_x10": "a norm's epsilon times 10",
    "swap_weights": "two weights, or two halves of one, loaded into each other's place",
    "other_gelu": "GELU of the other form (tanh for exact, exact for tanh)",
    "rope_theta": "the rotary embedding's theta times 10",
    "causal_off_by_one": "the causal mask one position off (the diagonal of jnp.tril / jnp.triu + 1)",
    "drop_residual": "a residual dropped: its skip term (an input, or a submodule's output)"
    " subtracted from the module's output",
    "skip_cast": "a cast to at least float32 skipped (a cast helper of the port made the identity)",
}
EPS_NAMES = ("epsilon", "eps", "variance_epsilon", "norm_eps", "layer_norm_eps")
THETA_NAMES = ("rope_theta", "theta", "base")


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One row: `kind` (KINDS) applied at the port module `path` (its dotted attribute path, ""
    the port itself: torch's path where the port mirrors torch's names), run in `dtype`.
    `names`: the torch module the report must name (default `path`).
    `option`, by kind: the output index (transpose_output, drop_position: `(index, axis)`;
    permute_axes: `(index, permutation)`), `(heads, first, stop)` features of the heads
    (permute_heads), the attribute (eps_x10, rope_theta), `"module:function"` (skip_cast), the
    skip term (drop_residual: an input's position or keyword, or `{"from": submodule}`), two
    `(variable path, slice or None)` (swap_weights).
    `finding`: why it survives, with the dtype that would catch it, if it does."""

    kind: str
    path: str
    dtype: str = "float32"
    names: str | None = None
    option: object = None
    finding: str = ""

    @property
    def expected(self) -> str:
        return self.path if self.names is None else self.names

    @property
    def where(self) -> str:
        """Where the mutation is made, as the report prints it."""
        if self.kind == "swap_weights":
            return " <-> ".join(p + _slice(s) for p, s in self.option)
        return self.path or "(root)"


def _slice(s) -> str:
    if not isinstance(s, slice) or s == slice(None):
        return ""
    return f"[{'' if s.start is None else s.start}:{'' if s.stop is None else s.stop}]"


@dataclasses.dataclass(frozen=True)
class Spec:
    """A port's mutation table: its factories (as `python -m parity diff` takes them), the
    mutants, and each kind that does not apply with the reason. `diff` holds further keyword
    arguments of `parity.diff.diff` (`rename=`)."""

    name: str
    torch_factory: Callable
    nnx_factory: Callable
    mutants: Sequence[Mutant]
    not_applicable: Mapping[str, str] = dataclasses.field(default_factory=dict)
    diff: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def check(self) -> Spec:
        """Raise ValueError (one line) unless every kind is mutated or said not to apply."""
        kinds = {m.kind for m in self.mutants}
        unknown = sorted((kinds | set(self.not_applicable)) - set(KINDS))
        if unknown:
            raise ValueError(f"{self.name}: unknown mutation kinds {unknown}; known: {list(KINDS)}")
        both = sorted(kinds & set(self.not_applicable))
        if both:
            raise ValueError(f"{self.name}: kinds both mutated and not applicable: {both}")
        left = [k for k in KINDS if k not in kinds and k not in self.not_applicable]
        if left:
            raise ValueError(
                f"{self.name}: kinds neither mutated nor said not to apply (with the reason): {left}"
            )
        return self


# --------------------------------------------------------------------------------- mechanisms


def _usage_error():
    from parity.diff import UsageError

    return UsageError


def _mutation_error(mutant: Mutant, error: Exception) -> Exception:
    """A mutant that cannot be made (no such module or attribute, an output of another shape):
    the table's error, one line, never a kill."""
    return _usage_error()(
        f"mutant {mutant.kind} at {mutant.where!r} cannot be made: {type(error).__name__}: {error}"
    )


def module_at(port, path: str):
    """The port's submodule at a torch-style dotted path (list indices as numbers)."""
    obj = port
    for part in path.split(".") if path else ():
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def _with_call(module, wrap: Callable) -> None:
    """Swap the class of this one module for a subclass whose __call__ is
    `wrap(original_call, self, *args, **kwargs)`."""
    base = type(module)

    def __call__(self, *args, **kwargs):
        return wrap(super(cls, self).__call__, self, *args, **kwargs)

    cls = type(f"Mutant{base.__name__}", (base,), {"__call__": __call__})
    module.__class__ = cls


def _outputs_changed(module, index: int, change: Callable) -> None:
    """out[index] (the output itself when it is one array) replaced by change(out, self, args,
    kwargs); a change that cannot be made raises MutationError's UsageError, not a kill."""

    def changed(out, self, args, kwargs):
        try:
            if isinstance(out, (tuple, list)):
                items = list(out)
                items[index] = change(items[index], self, args, kwargs)
                return type(out)(items) if isinstance(out, tuple) else items
            if index != 0:
                raise ValueError(f"output {index}: the module returns one array")
            return change(out, self, args, kwargs)
        except Exception as e:
            raise _usage_error()(f"the output cannot be changed: {type(e).__name__}: {e}") from e

    def wrap(call, self, *args, **kwargs):
        return changed(call(*args, **kwargs), self, args, kwargs)

    _with_call(module, wrap)


@contextlib.contextmanager
def _replaced(where: str, replacement: Callable):
    """`module:function` (or `module:Class.method`) replaced while the block runs."""
    mod_name, _, attr = where.partition(":")
    owner = importlib.import_module(mod_name)
    *parents, name = attr.split(".")
    for p in parents:
        owner = getattr(owner, p)
    original = getattr(owner, name)
    setattr(owner, name, replacement(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def _functions_replaced(module, replacements: Sequence[tuple[str, Callable]]) -> None:
    def wrap(call, self, *args, **kwargs):
        with contextlib.ExitStack() as stack:
            for where, replacement in replacements:
                stack.enter_context(_replaced(where, replacement))
            return call(*args, **kwargs)

    _with_call(module, wrap)


def _attribute(module, names: Sequence[str], option) -> str:
    found = [option] if option else [n for n in names if hasattr(module, n)]
    if not found or not hasattr(module, found[0]):
        raise ValueError(f"{type(module).__name__} has none of the attributes {list(names)}")
    return found[0]


def _input(args, kwargs, which):
    if isinstance(which, str):
        return kwargs[which]
    return args[which or 0]


def _roll_heads(x, heads: int, first: int, stop: int):
    """Roll by one the `heads` heads held in features [first, stop) of the last axis (an output
    whose last two axes are (heads, head_dim) is rolled on its heads axis)."""
    import jax.numpy as jnp

    if x.ndim >= 2 and x.shape[-2] == heads and (first, stop) == (0, heads * x.shape[-1]):
        return jnp.roll(x, 1, axis=-2)
    part = x[..., first:stop]
    part = jnp.roll(part.reshape(*part.shape[:-1], heads, -1), 1, axis=-2).reshape(part.shape)
    return jnp.concatenate([x[..., :first], part, x[..., stop:]], axis=-1)


def _gelu_other(original):
    def gelu(x, approximate=True):
        return original(x, approximate=not approximate)

    return gelu


def _diagonal_plus_one(original):
    def shifted(m, k=0, *args, **kwargs):
        return original(m, k + 1, *args, **kwargs)

    return shifted


def _identity(_original):
    def identity(first, *_args, **_kwargs):
        return first

    return identity


def _variable(port, path: str):
    *module, name = path.split(".")
    return getattr(module_at(port, ".".join(module)), name)


def _transpose_output(target, _port, option):
    import jax.numpy as jnp

    _outputs_changed(target, option or 0, lambda o, *_: jnp.swapaxes(o, -1, -2))


def _permute_axes(target, _port, option):
    import jax.numpy as jnp

    index, perm = option
    _outputs_changed(target, index, lambda o, *_: jnp.transpose(o, perm))


def _drop_position(target, _port, option):
    import jax.numpy as jnp

    index, axis = option or (0, 1)
    _outputs_changed(
        target, index, lambda o, *_: jnp.take(o, jnp.arange(o.shape[axis] - 1), axis=axis)
    )


def _permute_heads(target, _port, option):
    heads, first, stop = option
    _outputs_changed(target, 0, lambda o, *_: _roll_heads(o, heads, first, stop))


def _drop_bias(target, _port, _option):
    _outputs_changed(target, 0, lambda o, self, *_: o - self.bias[...].astype(o.dtype))


def _times_10(names):
    def mutate(target, _port, option):
        name = _attribute(target, names, option)
        setattr(target, name, getattr(target, name) * 10)

    return mutate


def _swap_weights(_target, port, option):
    import jax.numpy as jnp

    (a, sa), (b, sb) = ((path, slice(None) if s is None else s) for path, s in option)
    va, vb = _variable(port, a), _variable(port, b)
    xa, xb = jnp.asarray(va[...]), jnp.asarray(vb[...])
    if a == b:  # two slices of one variable
        va[...] = xa.at[sa].set(xa[sb]).at[sb].set(xa[sa])
    else:
        va[...], vb[...] = xa.at[sa].set(xb[sb]), xb.at[sb].set(xa[sa])


def _drop_residual(target, _port, option):
    """The skip term subtracted from the module's output: one of its inputs (a position or a
    keyword; the first by default), or `{"from": path}`, the output of its submodule at `path`
    in the same call (a residual taken after a norm inside the module)."""
    if isinstance(option, Mapping):
        seen = []

        def record(call, _self, *args, **kwargs):
            seen.append(call(*args, **kwargs))
            return seen[-1]

        _with_call(module_at(target, option["from"]), record)
        _outputs_changed(target, 0, lambda o, *_: o - seen[-1])
        return
    _outputs_changed(target, 0, lambda o, _s, args, kwargs: o - _input(args, kwargs, option))


def _replacing(*replacements):
    def mutate(target, _port, option):
        _functions_replaced(target, replacements or [(option, _identity)])

    return mutate


_APPLY = {
    "transpose_output": _transpose_output,
    "permute_axes": _permute_axes,
    "drop_position": _drop_position,
    "permute_heads": _permute_heads,
    "drop_bias": _drop_bias,
    "eps_x10": _times_10(EPS_NAMES),
    "swap_weights": _swap_weights,
    "other_gelu": _replacing(("jax.nn:gelu", _gelu_other)),
    "rope_theta": _times_10(THETA_NAMES),
    "causal_off_by_one": _replacing(
        ("jax.numpy:tril", _diagonal_plus_one), ("jax.numpy:triu", _diagonal_plus_one)
    ),
    "drop_residual": _drop_residual,
    "skip_cast": _replacing(),  # the option names the helper
}
assert set(_APPLY) == set(KINDS)


def apply(mutant: Mutant, port):
    """The port with `mutant` applied (in place); returns it. A mutant that cannot be made raises
    parity.diff.UsageError (one line)."""
    if mutant.kind not in _APPLY:
        raise _usage_error()(f"unknown mutation kind {mutant.kind!r}; known: {list(KINDS)}")
    try:
        _APPLY[mutant.kind](module_at(port, mutant.path), port, mutant.option)
    except Exception as e:
        raise _mutation_error(mutant, e) from e
    return port


def mutated_factory(nnx_factory: Callable, mutant: Mutant) -> Callable:
    def factory(torch_module):
        return apply(mutant, nnx_factory(torch_module))

    factory.__name__ = f"{getattr(nnx_factory, '__name__', 'nnx_factory')}+{mutant.kind}"
    return factory


# --------------------------------------------------------------------------------------- runs


@dataclasses.dataclass
class Outcome:
    mutant: Mutant
    killed: bool
    named: str | None  # the first divergent module, None when every tensor agrees
    why: str = ""  # the failing row in one line, or the run's error

    @property
    def as_expected(self) -> bool:
        if self.mutant.finding:
            return not self.killed
        return self.killed and self.named == self.mutant.expected


@dataclasses.dataclass
class Result:
    spec: Spec
    baseline: dict[str, bool]  # dtype -> the unmutated port passes
    outcomes: list[Outcome]

    @property
    def killed(self) -> int:
        return sum(o.killed for o in self.outcomes)

    @property
    def passed(self) -> bool:
        return all(self.baseline.values()) and all(o.as_expected for o in self.outcomes)

    def rate(self, dtype: str | None = None) -> tuple[int, int]:
        """(killed, mutants), over all dtypes or one."""
        rows = [o for o in self.outcomes if dtype is None or o.mutant.dtype == dtype]
        return sum(o.killed for o in rows), len(rows)


def run(spec: Spec, *, grads: bool = False, jit: bool = False) -> Result:
    """Every mutant of `spec` through the diff, after the unmutated port in each dtype used."""
    from parity.check import ROOT, where
    from parity.diff import RunError, UsageError, diff

    spec.check()
    kw = dict(spec.diff, grads=grads, jit=jit)
    dtypes = list(dict.fromkeys(m.dtype for m in spec.mutants))
    baseline = {
        dt: diff(spec.torch_factory, spec.nnx_factory, dtype=dt, **kw).passed for dt in dtypes
    }
    outcomes = []
    for m in spec.mutants:
        try:
            report = diff(
                spec.torch_factory, mutated_factory(spec.nnx_factory, m), dtype=m.dtype, **kw
            )
        except UsageError as e:  # the mutant cannot be made: the table's error, not a kill
            if str(e).startswith("mutant "):
                raise
            raise UsageError(f"mutant {m.kind} at {m.where!r}: {e}") from e
        except RunError as e:  # the mutant broke the port's own code: killed, named by the error
            outcomes.append(Outcome(m, True, "" if e.where == ROOT else e.where, str(e)))
            continue
        found = report.first_divergent()
        if found is None:
            outcomes.append(Outcome(m, False, None))
        else:
            outcomes.append(Outcome(m, True, found[0], where(found[1])))
    return Result(spec, baseline, outcomes)


def format_result(result: Result) -> str:
    from parity.check import module_name

    spec = result.spec
    lines = [
        "the unmutated port: "
        + ", ".join(f"{dt} {'passes' if ok else 'FAILS'}" for dt, ok in result.baseline.items())
    ]
    head = f"{'kind':<18} {'module':<32} {'dtype':<9} {'result':<8} named"
    lines += ["", head, "-" * len(head)]
    for o in result.outcomes:
        m = o.mutant
        status = "killed" if o.killed else "SURVIVES"
        named = "-" if o.named is None else module_name(o.named)
        if o.killed and o.named != m.expected:
            named += f"  (expected {module_name(m.expected)})"
        if m.finding:
            named += f"  finding: {m.finding}"
        lines.append(f"{m.kind:<18} {m.where:<32} {m.dtype:<9} {status:<8} {named}")
    for kind, why in spec.not_applicable.items():
        lines.append(f"not applicable: {kind}: {why}")
    killed, total = result.rate()
    per_dtype = ", ".join(
        f"{dt} {result.rate(dt)[0]}/{result.rate(dt)[1]}" for dt in result.baseline
    )
    named = sum(o.killed and o.named == o.mutant.expected for o in result.outcomes)
    lines.append(
        f"kill rate {spec.name}: {killed}/{total} ({100 * killed / max(total, 1):.0f}%; {per_dtype});"
        f" named at the expected module: {named}/{killed}"
    )
    return "\n".join(lines)


# -------------------------------------------------------------------------------------- command


def load_spec(text: str) -> Spec:
    from parity.diff import UsageError, load_factory

    try:
        found = load_factory(text, "SPEC")
    except UsageError as e:
        if "not a callable" not in str(e):
            raise
        module_name, _, attr = text.partition(":")
        found = getattr(importlib.import_module(module_name), attr)
    spec = found if isinstance(found, Spec) else found()
    if not isinstance(spec, Spec):
        raise UsageError(
            f"SPEC {text!r} gave a {type(spec).__name__}: expected a parity.mutate.Spec"
        )
    try:
        return spec.check()
    except ValueError as e:
        raise UsageError(f"SPEC {text!r}: {e}") from e


def main(argv: Sequence[str] | None = None) -> int:
    from parity.diff import RunError, UsageError

    p = argparse.ArgumentParser(
        prog="python -m parity mutate",
        description="Mutants of a port, each through the diff: killed, and named where it was made.",
        epilog="exit status: 0 every mutant killed and named as expected (or a written finding);"
        " 1 otherwise; 2 a bad SPEC; 3 the unmutated port's run failed",
    )
    p.add_argument("spec", metavar="SPEC", help="package.module:name of a parity.mutate.Spec")
    p.add_argument("--grads", action="store_true", help="compare every gradient too")
    p.add_argument("--jit", action="store_true", help="run the port as one compiled program")
    args = p.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        result = run(spec, grads=args.grads, jit=args.jit)
    except (UsageError, RunError) as e:
        print(f"python -m parity mutate: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 3
    print(f"parity mutate {args.spec}: {len(spec.mutants)} mutants of {spec.name}")
    print(format_result(result))
    return 0 if result.passed else 1
