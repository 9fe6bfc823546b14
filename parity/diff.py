"""`python -m parity diff TORCH_FACTORY NNX_FACTORY [--dtype float32|float64|bfloat16] [--grads]`

Runs a torch module and its Flax NNX port on the same inputs and prints, module by module, how far
the port is from torch; the last line names the first divergent module.

Each factory is `package.module:callable`, importable from the current directory:

- `TORCH_FACTORY()` returns `(torch_module, args)` or `(torch_module, args, kwargs)`: the
  positional inputs as a tuple, the keyword inputs as a dict; either may nest tuples, lists and
  dicts of tensors (`position_embeddings=(cos, sin)`). A factory with a `dtype` parameter is
  called with the run's torch dtype, to build its inputs in it (a mask's `finfo(dtype).min`);
- `NNX_FACTORY(torch_module)` returns the NNX port holding that module's weights (typically
  `parity.keymap.load_torch(MyPort(...), torch_module)`). The port is called with the same
  structure, every tensor a jax array.

Both models run in eval mode (`--train`: train mode, e.g. BatchNorm on batch statistics; dropout
must then be off, the two sides cannot draw the same masks). `--dtype float64` converts the torch
module and every floating input tensor to float64 before the port is built, with JAX's x64 on, and
runs the reference's own casts to float32 (`.float()`, `.to(torch.float32)`, `dtype=torch.float32`
arguments) in float64, the factory's too (parity/promote.py); a note says how many and where.
`--keep-casts` runs them as written. `--dtype bfloat16` is a pure bf16 run, not autocast: the torch
module cast with `module.to(torch.bfloat16)` beside the port in bf16, each tensor within BFLOAT16
or 3 x torch's own bf16 error against its float64 run where that is wider (each row names its
bound). The bound is FLOAT64 (float32: FLOAT32), or with `--envelope` 16 times the one-ulp
envelope of torch's own run (parity/envelope.py). Module paths are torch's (`blocks.1.norm`);
`--rename NNX=TORCH` rewrites a port path prefix that differs (`--rename =transformer`: every port
path gains the prefix `transformer.`, as nanoGPT's flattened ModuleDict needs). Every port tensor
must have torch's shape, unless the rule of its module's class declares another layout
(parity/keymap.py: flax's convolutions and norms channels-last, heads on their own axis); those
are compared in torch's layout, and a note names them and the rule.

Exit status: 0 when every compared tensor agrees; 1 when one differs (the last line is then
`first divergent module: <path>`); 2 for bad arguments (one line saying what was expected) or a
port whose variables do not match the torch state_dict (the key map's list of every key); 3 when
the run itself fails: a factory or a forward raises (one line naming the side, torch or JAX, the
module or factory, and the exception; `--traceback` prints the whole traceback instead).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from parity.capture import (
    Capture,
    capture_nnx,
    capture_torch,
    failed_in,
    nnx_state,
    prefix_rename,
)
from parity.check import (
    Report,
    compare_calls,
    compare_named,
    envelope,
    exact,
    format_report,
    module_name,
)
from parity.compare import BFLOAT16, BFLOAT16_AS_TORCH, FLOAT32, FLOAT64, Tolerance
from parity.envelope import ENVELOPE_FACTOR, perturbed_copies, tolerance
from parity.keymap import KeyMap, build_keymap, declared_layouts, describe_torch, module_kinds
from parity.promote import Casts, promoted_casts
from parity.state_dict import StateDictError, to_numpy

TOLERANCES = {"float32": FLOAT32, "float64": FLOAT64, "bfloat16": BFLOAT16}
EXIT_CODES = """exit status:
  0  every compared tensor agrees
  1  a tensor differs; the last line is `first divergent module: <path>`
  2  bad arguments, or a port whose variables do not match the torch state_dict
  3  the run itself failed: a factory or a forward raised (one line: the side, torch or JAX,
     the module or factory, and the exception; --traceback for the whole traceback)"""
ENVELOPE_SEEDS = (1, 2)


class UsageError(ValueError):
    """Bad command-line input: the message is one line saying what was expected."""


class RunError(RuntimeError):
    """The run itself failed: `side` ("torch" or "JAX") raised `error` in `where` (a module path,
    or the factory). Its message is one line."""

    def __init__(self, side: str, where: str, error: BaseException):
        self.side, self.where, self.error = side, where, error
        lines = str(error).strip().splitlines()
        message = lines[0] if lines else ""
        more = " ..." if len(lines) > 1 else ""
        super().__init__(
            f"the {side} run failed in {where}: {type(error).__name__}: {message}{more}"
        )


@contextlib.contextmanager
def _side(side: str):
    """Exceptions of the block as RunError, at the module call they started in."""
    try:
        yield
    except (UsageError, StateDictError, RunError):
        raise
    except Exception as e:
        module = failed_in(e)
        raise RunError(side, module_name(module) if module is not None else "(root)", e) from e


# import name -> the distribution that installs it, where they differ; and, for a factory module of
# this repository's own (its tests), the repository's extra that carries it
_DISTRIBUTIONS = {
    "segment_anything": "segment-anything",
    "yaml": "pyyaml",
    "sklearn": "scikit-learn",
}
_EXTRAS = {
    "pytest": "pip install -e '.[dev]'",
    "transformers": "pip install -e '.[zoo]'",
    "segment_anything": "pip install -e '.[zoo]'",
    "torch": "pip install -e '.[parity]'",
}


def load_factory(spec: str, role: str) -> Callable:
    """`package.module:callable` -> the callable, imported with the current directory on the path.
    `role` (TORCH_FACTORY / NNX_FACTORY) names the argument in the error."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr or not attr.isidentifier():
        raise UsageError(f"{role} {spec!r}: expected package.module:callable")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and not (module_name + ".").startswith(e.name + "."):  # found; it imports e.name
            extra = _EXTRAS.get(e.name) if _in_this_repository(module_name) else None
            raise UsageError(
                f"{role} {spec!r}: {module_name!r} imports {e.name!r}, which this environment "
                f"lacks: pip install {_DISTRIBUTIONS.get(e.name, e.name)}"
                + (f" (this repository's tests: {extra})" if extra else "")
            ) from e
        raise UsageError(
            f"{role} {spec!r}: cannot import {module_name!r} from {os.getcwd()} ({e})"
        ) from e
    fn = getattr(module, attr, None)
    if fn is None:
        raise UsageError(f"{role} {spec!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise UsageError(f"{role} {spec!r}: {attr!r} is a {type(fn).__name__}, not a callable")
    return fn


def _in_this_repository(module_name: str) -> bool:
    """Whether the factory module is a file of the repository the toolkit was cloned with (its
    tests), whose extras a hint may name; never for a project of one's own, nor for the toolkit
    installed alone (its parent directory is site-packages)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file() or not (root / "toolkit").is_dir():
        return False
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return False
    origin = getattr(found, "origin", None)
    return bool(origin) and Path(origin).resolve().is_relative_to(root)


def _torch_inputs(factory: Callable, name: str, dtype: str):
    """TORCH_FACTORY's (module, args, kwargs), the module and every floating input tensor in
    `dtype`."""
    import torch

    to = getattr(torch, dtype)
    try:
        got = factory(dtype=to) if _takes_dtype(factory) else factory()
    except Exception as e:
        raise RunError("torch", f"TORCH_FACTORY {name}", e) from e
    expected = "expected (torch.nn.Module, tuple of example inputs[, dict of keyword inputs])"
    if not (isinstance(got, tuple) and len(got) in (2, 3) and isinstance(got[0], torch.nn.Module)):
        raise UsageError(f"TORCH_FACTORY {name} returned {_kind(got)}: {expected}")
    module, args, kwargs = got if len(got) == 3 else (*got, {})
    if not isinstance(args, tuple):
        raise UsageError(
            f"TORCH_FACTORY {name} returned inputs of type {type(args).__name__}: expected a "
            "tuple of example inputs (one element per positional argument)"
        )
    if not (isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs)):
        raise UsageError(
            f"TORCH_FACTORY {name} returned keyword inputs of type {type(kwargs).__name__}: "
            "expected a dict from argument name to input"
        )
    if dtype != "float32":
        module = module.to(to)
        args, kwargs = _cast_floating((args, kwargs), to)
    return module, args, kwargs


def _takes_dtype(factory: Callable) -> bool:
    import inspect

    try:
        return "dtype" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or a C callable: no signature to read
        return False


def _cast_floating(inputs, to):
    """Every floating torch tensor in nested tuples, lists and dicts cast to `to` (integer and
    bool tensors, and anything that is not a tensor, as they are)."""
    import torch

    if isinstance(inputs, torch.Tensor):
        return inputs.to(to) if inputs.is_floating_point() else inputs
    return _map_nested(lambda x: _cast_floating(x, to), inputs)


def _map_nested(fn, inputs):
    if isinstance(inputs, dict):
        return {k: fn(v) for k, v in inputs.items()}
    if isinstance(inputs, tuple) and hasattr(inputs, "_fields"):  # a namedtuple
        return type(inputs)(*(fn(v) for v in inputs))
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(fn(v) for v in inputs)
    return inputs


def _kind(x) -> str:
    if isinstance(x, tuple):
        return f"a tuple of {len(x)} ({', '.join(type(v).__name__ for v in x)})"
    return f"a {type(x).__name__}"


def _to_jax(x):
    """The same nesting, every torch tensor a jax array (bfloat16 stays bfloat16)."""
    import jax.numpy as jnp
    import torch

    if isinstance(x, torch.Tensor):
        return jnp.asarray(to_numpy(x))
    return _map_nested(_to_jax, x)


def _dropout_note(module, train: bool) -> list[str]:
    import torch

    live = [
        n or "(root)"
        for n, m in module.named_modules()
        if isinstance(m, torch.nn.Dropout) and m.p > 0
    ]
    if train and live:
        return [
            f"dropout is live in train mode ({', '.join(live)}): torch and the port draw "
            "different masks, so those outputs cannot agree; use eval mode or p=0"
        ]
    return []


@contextlib.contextmanager
def _x64(on: bool):
    import jax

    if on:
        with jax.enable_x64(True):
            yield
    else:
        yield


def diff(
    torch_factory: Callable,
    nnx_factory: Callable,
    *,
    dtype: str = "float32",
    grads: bool = False,
    train: bool = False,
    use_envelope: bool = False,
    rename: Callable[[str], str] | None = None,
    jit: bool = False,
    keep_casts: bool = False,
    names: tuple[str, str] = ("TORCH_FACTORY", "NNX_FACTORY"),
) -> Report:
    """Build both models from the factories and compare them (the command's work, as a
    function): weights, every module's output, buffers after the call and, with `grads`,
    every parameter's gradient. In a float64 run the reference's casts to float32 run in float64
    unless `keep_casts` (parity/promote.py); `Report.notes` says how many, by module. Raises
    UsageError for bad factories, StateDictError for a port that does not map, RunError when a
    factory or a forward raises."""
    if dtype not in TOLERANCES:
        raise UsageError(f"--dtype {dtype!r}: expected one of {', '.join(TOLERANCES)}")
    with _x64(dtype != "float32"):  # bfloat16: torch's own float64 run is the exact value
        return _diff(
            torch_factory,
            nnx_factory,
            dtype,
            grads,
            train,
            use_envelope,
            rename,
            jit,
            keep_casts,
            names,
        )


def _diff(
    torch_factory, nnx_factory, dtype, grads, train, use_envelope, rename, jit, keep_casts, names
):
    from flax import nnx

    float64 = dtype == "float64"

    def as_float64(module=None, outside=""):  # a float64 run of the reference: its casts too
        if not float64:
            return contextlib.nullcontext(None)
        return promoted_casts(module, keep=keep_casts, outside=outside)

    with as_float64(outside="TORCH_FACTORY") as built:
        module, args, kwargs = _torch_inputs(torch_factory, names[0], dtype)
    module.train(train)
    weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    described = describe_torch(module)
    layouts = declared_layouts(module_kinds(module))
    try:
        port = nnx_factory(module)
    except (UsageError, StateDictError):  # load_torch's list of keys that do not map
        raise
    except Exception as e:
        raise RunError("JAX", f"NNX_FACTORY {names[1]}", e) from e
    if not isinstance(port, nnx.Module):
        raise UsageError(
            f"NNX_FACTORY {names[1]} returned {_kind(port)}: expected a flax.nnx.Module"
        )
    port.train() if train else port.eval()
    km = build_keymap(described, port, rename=rename)
    loaded = km.to_torch(nnx_state(port))  # before the call: train mode moves the buffers
    # the copies first: a train-mode call moves the reference's running statistics
    copies = list(perturbed_copies(module, ENVELOPE_SEEDS)) if use_envelope else []
    exact = _float64_twin(module, args, kwargs) if dtype == "bfloat16" else None
    with _side("torch"), as_float64(module) as casts:
        ref = capture_torch(module, args, kwargs, grads=grads)
    with _side("JAX"):
        jargs, jkwargs = _to_jax((args, kwargs))
        mine = capture_nnx(port, jargs, jkwargs, grads=grads, jit=jit, rename=rename)
    tol = TOLERANCES[dtype]
    with _side("torch"):
        if exact is not None:  # how far torch's own bf16 run is from its float64 run, per tensor
            twin, twin_args, twin_kwargs = exact
            with promoted_casts(twin, keep=keep_casts):
                run = capture_torch(twin, twin_args, twin_kwargs, grads=grads)
            bounds = _as_torch(envelope(run, [ref]))
        elif copies:
            runs = []
            for m in copies:
                with as_float64(m):
                    runs.append(capture_torch(m, args, kwargs, grads=grads))
            env = envelope(ref, runs)
            bounds = {k: tolerance(v, ENVELOPE_FACTOR) for k, v in env.items()}
        else:
            bounds = {}
    notes = [*_casts_note(built, casts), *_dropout_note(module, train)]
    return _report(km, weights, loaded, described, ref, mine, tol, bounds, notes, layouts)


def _casts_note(built: Casts | None, ran: Casts | None) -> list[str]:
    """One line on the reference's float32 casts in a float64 run: how many, where, and whether
    they ran in float64."""
    if built is None or ran is None:
        return []
    both = Casts(built.by_module + ran.by_module, promoted=ran.promoted)
    if not both.total:
        return []
    n = f"{both.total} cast{'s' if both.total > 1 else ''} to float32 in torch"
    if both.promoted:
        return [f"{n} ran in float64 (--keep-casts: as written): {both.where()}"]
    return [
        f"--keep-casts: {n} ran in float32 ({both.where()}); a float64 port agrees after them"
        " only to float32 round-off"
    ]


def _float64_twin(module, args, kwargs):
    """A float64 copy of the (bfloat16) torch module and inputs: the same values, exactly."""
    import copy

    import torch

    twin = copy.deepcopy(module).double()
    return twin, *_cast_floating((args, kwargs), torch.float64)


def _as_torch(errors: dict) -> dict:
    """Per tensor: BFLOAT16, or BFLOAT16_AS_TORCH's factor x torch's own bf16 error (against
    its float64 run) where that is wider (parity/compare.py); the name says which."""
    b = BFLOAT16_AS_TORCH
    return {
        key: (
            Tolerance(f"{b.factor:g} x torch's own {err:.1e}", b.factor * err, why=b.why)
            if b.factor * err > b.floor
            else BFLOAT16
        )
        for key, err in errors.items()
    }


BF16_RUN = (
    "bfloat16 is a pure bf16 run, not autocast: the torch module cast with"
    " module.to(torch.bfloat16) (weights, buffers and floating inputs; its own casts to float32"
    " run as written) beside the port in bfloat16"
)
BF16_BOUND = (
    "per tensor BFLOAT16 (1e-2), or 3 x torch's own bf16 error against its float64 run where"
    " that is wider (BFLOAT16_AS_TORCH); each row names its bound"
)


def _report(
    km: KeyMap, weights, loaded, described, ref: Capture, mine: Capture, tol, bounds, notes, layouts
) -> Report:
    def tolerance_for(key):
        return bounds.get(key, tol)

    rows = compare_named("weights", loaded, weights, exact, dtypes=True)
    out_rows, call_notes = compare_calls(
        mine.calls, ref.calls, tolerance_for, dtypes=True, layouts=layouts
    )
    rows += out_rows
    buffers = {tk.key for tk in described if not tk.parameter}
    port_state = km.to_torch(mine.state or {})
    rows += compare_named(
        "state",
        port_state,
        {k: v for k, v in ref.state.items() if k in buffers},
        tolerance_for,
        dtypes=True,
    )
    if ref.grads is not None:
        rows += compare_named(
            "grads", km.to_torch(mine.grads or {}), ref.grads, tolerance_for, dtypes=True
        )
    return Report(rows, [*_keymap_notes(km), *call_notes, *notes])


def _keymap_notes(km: KeyMap) -> list[str]:
    if km.complete and not km.dropped:
        return []
    return ["key map: " + km.report().replace("\n", "\n  ")]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m parity diff",
        description="Compare a torch module and its Flax NNX port module by module.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("torch_factory", metavar="TORCH_FACTORY", help="package.module:callable")
    p.add_argument("nnx_factory", metavar="NNX_FACTORY", help="package.module:callable")
    p.add_argument(
        "--dtype",
        choices=tuple(TOLERANCES),
        default="float32",
        help="float32 (bound FLOAT32 1e-5); float64 (FLOAT64 1e-12, torch's own casts to"
        f" float32 run in float64); {BF16_RUN}, bound {BF16_BOUND}",
    )
    p.add_argument("--grads", action="store_true", help="also compare every parameter's gradient")
    p.add_argument("--train", action="store_true", help="run both models in train mode")
    p.add_argument("--envelope", action="store_true", help="bound: 16x the one-ulp envelope")
    p.add_argument("--jit", action="store_true", help="run the port as one compiled program")
    p.add_argument(
        "--keep-casts",
        action="store_true",
        help="float64: run the reference's casts to float32 as written (by default they run in"
        " float64)",
    )
    p.add_argument(
        "--traceback",
        action="store_true",
        help="when the run itself fails, the whole traceback instead of one line",
    )
    p.add_argument(
        "--rename",
        action="append",
        default=[],
        metavar="NNX=TORCH",
        help="a port module path prefix and the torch path it stands for (repeatable)",
    )
    args = p.parse_args(argv)
    try:
        rename = _parse_rename(args.rename)
        torch_factory = load_factory(args.torch_factory, "TORCH_FACTORY")
        nnx_factory = load_factory(args.nnx_factory, "NNX_FACTORY")
        report = diff(
            torch_factory,
            nnx_factory,
            dtype=args.dtype,
            grads=args.grads,
            train=args.train,
            use_envelope=args.envelope,
            rename=rename,
            jit=args.jit,
            keep_casts=args.keep_casts,
            names=(args.torch_factory, args.nnx_factory),
        )
    except RunError as e:
        if args.traceback:
            raise e.error from None  # its own traceback, where it was raised
        print(f"python -m parity diff: {e}", file=sys.stderr)
        return 3
    except UsageError as e:
        print(f"python -m parity diff: {e}", file=sys.stderr)
        return 2
    except StateDictError as e:  # the port's load_torch / check_keys: every key that does not map
        print(f"python -m parity diff: NNX_FACTORY {args.nnx_factory}: {e}", file=sys.stderr)
        return 2
    tol = TOLERANCES[args.dtype]
    bound = f"{tol.name.upper()} ({tol.rtol:g})"
    if args.envelope:
        bound = "per tensor 16 x the one-ulp envelope of torch's own run (at least 1e-12)"
    if args.dtype == "bfloat16":
        bound = f"{BF16_BOUND}\n{BF16_RUN}"
    print(
        f"parity diff {args.torch_factory} -> {args.nnx_factory}: dtype {args.dtype},"
        f" {'train' if args.train else 'eval'} mode, bound {bound}"
    )
    print(format_report(report, show=("outputs", "state", "grads")))
    return 0 if report.passed else 1


def _parse_rename(items: Sequence[str]):
    pairs = {}
    for item in items:
        old, sep, new = item.partition("=")
        if not sep or not (old or new):
            raise UsageError(f"--rename {item!r}: expected NNX_PREFIX=TORCH_PREFIX")
        pairs[old] = new
    return prefix_rename(pairs) if pairs else None
