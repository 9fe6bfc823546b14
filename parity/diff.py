"""`python -m parity diff TORCH_FACTORY NNX_FACTORY [--dtype float32|float64] [--grads]`

Runs a torch module and its Flax NNX port on the same inputs and prints, module by module, how far
the port is from torch; the last line names the first divergent module.

Each factory is `package.module:callable`, importable from the current directory:

- `TORCH_FACTORY()` returns `(torch_module, example_inputs_tuple)`;
- `NNX_FACTORY(torch_module)` returns the NNX port holding that module's weights (typically
  `parity.keymap.load_torch(MyPort(...), torch_module)`).

Both models run in eval mode (`--train`: train mode, e.g. BatchNorm on batch statistics; dropout
must then be off, the two sides cannot draw the same masks). `--dtype float64` converts the torch
module and the floating inputs to float64 before the port is built, with JAX's x64 on; the bound
is FLOAT64 (float32: FLOAT32), or with `--envelope` 16 times the one-ulp envelope of torch's own
run (parity/envelope.py). Module paths are torch's (`blocks.1.norm`); `--rename NNX=TORCH`
rewrites a port path prefix that differs (`--rename =transformer`: every port path gains the
prefix `transformer.`, as nanoGPT's flattened ModuleDict needs). A port may keep flax's
channels-last layout inside (nnx.Conv, nnx.GroupNorm on NHWC): those outputs are compared in
torch's layout, and a note lists them (parity/check.py).

Exit status: 0 when every compared tensor agrees, 1 when one differs (the last line is then
`first divergent module: <path>`), 2 for bad arguments (one line saying what was expected) or
a port whose variables do not match the torch state_dict (the key map's list of every key).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from parity.capture import Capture, capture_nnx, capture_torch, nnx_state, prefix_rename
from parity.check import (
    Report,
    compare_calls,
    compare_named,
    envelope,
    exact,
    format_report,
)
from parity.compare import BFLOAT16, BFLOAT16_AS_TORCH, FLOAT32, FLOAT64, Tolerance
from parity.envelope import ENVELOPE_FACTOR, perturbed_copies, tolerance
from parity.keymap import KeyMap, build_keymap, describe_torch
from parity.state_dict import StateDictError, to_numpy

TOLERANCES = {"float32": FLOAT32, "float64": FLOAT64, "bfloat16": BFLOAT16}
ENVELOPE_SEEDS = (1, 2)


class UsageError(ValueError):
    """Bad command-line input: the message is one line saying what was expected."""


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
        raise UsageError(
            f"{role} {spec!r}: cannot import {module_name!r} from {os.getcwd()} ({e})"
        ) from e
    fn = getattr(module, attr, None)
    if fn is None:
        raise UsageError(f"{role} {spec!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise UsageError(f"{role} {spec!r}: {attr!r} is a {type(fn).__name__}, not a callable")
    return fn


def _torch_pair(factory: Callable, name: str, dtype: str):
    import torch

    got = factory()
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.nn.Module)):
        raise UsageError(
            f"TORCH_FACTORY {name} returned {_kind(got)}: expected (torch.nn.Module, tuple of "
            "example inputs)"
        )
    module, inputs = got
    if not isinstance(inputs, tuple):
        raise UsageError(
            f"TORCH_FACTORY {name} returned inputs of type {type(inputs).__name__}: expected a "
            "tuple of example inputs (one element per positional argument)"
        )
    if dtype != "float32":
        to = getattr(torch, dtype)
        module = module.to(to)
        inputs = tuple(
            x.to(to) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs
        )
    return module, inputs


def _kind(x) -> str:
    if isinstance(x, tuple):
        return f"a tuple of {len(x)} ({', '.join(type(v).__name__ for v in x)})"
    return f"a {type(x).__name__}"


def _to_jax(x):
    import jax.numpy as jnp
    import torch

    if isinstance(x, torch.Tensor):
        return jnp.asarray(to_numpy(x))  # bfloat16 stays bfloat16
    if isinstance(x, (tuple, list)):
        return type(x)(_to_jax(v) for v in x)
    return x


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
    names: tuple[str, str] = ("TORCH_FACTORY", "NNX_FACTORY"),
) -> Report:
    """Build both models from the factories and compare them (the command's work, as a
    function): weights, every module's output, buffers after the call and, with `grads`,
    every parameter's gradient."""
    if dtype not in TOLERANCES:
        raise UsageError(f"--dtype {dtype!r}: expected one of {', '.join(TOLERANCES)}")
    with _x64(dtype != "float32"):  # bfloat16: torch's own float64 run is the exact value
        return _diff(
            torch_factory, nnx_factory, dtype, grads, train, use_envelope, rename, jit, names
        )


def _diff(torch_factory, nnx_factory, dtype, grads, train, use_envelope, rename, jit, names):
    from flax import nnx

    module, inputs = _torch_pair(torch_factory, names[0], dtype)
    module.train(train)
    weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    described = describe_torch(module)
    port = nnx_factory(module)
    if not isinstance(port, nnx.Module):
        raise UsageError(
            f"NNX_FACTORY {names[1]} returned {_kind(port)}: expected a flax.nnx.Module"
        )
    port.train() if train else port.eval()
    km = build_keymap(described, port, rename=rename)
    loaded = km.to_torch(nnx_state(port))  # before the call: train mode moves the buffers
    # the copies first: a train-mode call moves the reference's running statistics
    copies = list(perturbed_copies(module, ENVELOPE_SEEDS)) if use_envelope else []
    exact = _float64_twin(module, inputs) if dtype == "bfloat16" else None
    ref = capture_torch(module, inputs, grads=grads)
    mine = capture_nnx(port, tuple(_to_jax(x) for x in inputs), grads=grads, jit=jit, rename=rename)
    tol = TOLERANCES[dtype]
    if exact is not None:  # how far torch's own bf16 run is from its float64 run, per tensor
        bounds = _as_torch(envelope(capture_torch(*exact, grads=grads), [ref]))
    elif copies:
        env = envelope(ref, [capture_torch(m, inputs, grads=grads) for m in copies])
        bounds = {k: tolerance(v, ENVELOPE_FACTOR) for k, v in env.items()}
    else:
        bounds = {}
    return _report(
        km, weights, loaded, described, ref, mine, tol, bounds, _dropout_note(module, train)
    )


def _float64_twin(module, inputs):
    """A float64 copy of the (bfloat16) torch module and inputs: the same values, exactly."""
    import copy

    import torch

    twin = copy.deepcopy(module).double()
    return twin, tuple(
        x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs
    )


def _as_torch(errors: dict) -> dict:
    """Per tensor: BFLOAT16, or BFLOAT16_AS_TORCH's factor x torch's own bf16 error where that is
    wider (parity/compare.py)."""
    b = BFLOAT16_AS_TORCH
    return {
        key: Tolerance(
            f"{b.name} (torch's own: {err:.1e})", max(b.floor, b.factor * err), why=b.why
        )
        for key, err in errors.items()
    }


def _report(
    km: KeyMap, weights, loaded, described, ref: Capture, mine: Capture, tol, bounds, notes
) -> Report:
    def tolerance_for(key):
        return bounds.get(key, tol)

    rows = compare_named("weights", loaded, weights, exact, dtypes=True)
    out_rows, call_notes = compare_calls(mine.calls, ref.calls, tolerance_for, dtypes=True)
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
    )
    p.add_argument("torch_factory", metavar="TORCH_FACTORY", help="package.module:callable")
    p.add_argument("nnx_factory", metavar="NNX_FACTORY", help="package.module:callable")
    p.add_argument("--dtype", choices=tuple(TOLERANCES), default="float32")
    p.add_argument("--grads", action="store_true", help="also compare every parameter's gradient")
    p.add_argument("--train", action="store_true", help="run both models in train mode")
    p.add_argument("--envelope", action="store_true", help="bound: 16x the one-ulp envelope")
    p.add_argument("--jit", action="store_true", help="run the port as one compiled program")
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
            names=(args.torch_factory, args.nnx_factory),
        )
    except UsageError as e:
        print(f"python -m parity diff: {e}", file=sys.stderr)
        return 2
    except StateDictError as e:  # the port's load_torch / check_keys: every key that does not map
        print(f"python -m parity diff: NNX_FACTORY {args.nnx_factory}: {e}", file=sys.stderr)
        return 2
    tol = TOLERANCES[args.dtype]
    bound = "16 x the one-ulp envelope" if args.envelope else f"{tol.name.upper()} ({tol.rtol:g})"
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
