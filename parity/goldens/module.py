"""Golden copies of any torch module, and the check of an NNX port against them without torch.

`record(out, name, torch_module, args)` runs the module once (every module's inputs and outputs,
the seeded cotangent loss of parity.capture, every parameter's gradient, the buffers after the
call) and, with an optimizer, K training steps (the loss and every state_dict tensor after each),
and writes OUT/NAME.npz plus a section NAME of OUT/manifest.json: the torch version, the ATen CPU
capability and the thread count (both change float32 bits), the seed, the dtype, the mode, the
optimizer, the state_dict layout (for the key map) and the list of calls. torch runs on one
thread while recording.

`check(out, name, port)` needs only numpy and JAX: it maps the stored state_dict into the port by
rule (parity.keymap), runs the port the same way and returns a parity.check.Report (print it
with parity.check.format_report).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from parity import machine
from parity.capture import Call, capture_nnx
from parity.check import Report, compare_calls, compare_named
from parity.compare import FLOAT32, FLOAT64, Tolerance
from parity.envelope import widened
from parity.goldens.common import load_npz, save_npz, write_manifest
from parity.keymap import TorchKey, build_keymap, declared_layouts
from parity.steps import (
    by_step,
    nnx_steps,
    optimizer_from_json,
    optimizer_to_json,
    steps_report,
)


def record(
    out: Path,
    name: str,
    torch_module,
    args: Sequence,
    *,
    optimizer=None,
    steps: int = 0,
    train: bool = False,
    envelope_seeds: Sequence[int] = (),
    seed: int = 0,
) -> Path:
    """Write OUT/NAME.npz and the manifest section NAME; returns the .npz path. `args` are the
    positional inputs (tensors, or Python scalars stored in the manifest). `envelope_seeds`:
    also run the reference once per seed with every weight moved by one ulp and store how far
    each output, gradient and step moved (the check then allows ENVELOPE_FACTOR x that where it
    is wider than the named bound: exactly-zero gradients, recurrences)."""
    import torch

    from parity.keymap import describe_torch, module_kinds

    tensors, scalars = _split_args(args)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch_module.train(train)
        weights = {k: v.detach().clone() for k, v in torch_module.state_dict().items()}
        here = machine.identity()
        cap, history, env = _run_reference(
            torch_module, args, optimizer, steps, seed, envelope_seeds
        )
    finally:
        torch.set_num_threads(threads)
    arrays = {f"weights/{k}": v for k, v in weights.items()}
    arrays.update({f"args/{i}": a for i, a in tensors.items()})
    for i, c in enumerate(cap.calls):
        arrays.update({f"calls/{i}/in/{j}": x for j, x in enumerate(c.args)})
        arrays.update({f"calls/{i}/out/{j}": x for j, x in enumerate(c.outputs)})
    arrays["loss"] = cap.loss
    arrays.update({f"grads/{k}": g for k, g in cap.grads.items()})
    arrays.update({f"state/{k}": v for k, v in cap.state.items()})
    for t, (loss, state) in enumerate(history, 1):
        arrays[f"steps/{t}/loss"] = loss
        arrays.update({f"steps/{t}/{k}": v for k, v in state.items()})
    path = save_npz(Path(out), name, arrays)
    section = {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": 1,
        "machine": here,  # the kernels: the same ones give the same bits (parity/machine.py)
        "seed": seed,
        "dtype": str(next(torch_module.parameters()).dtype).removeprefix("torch."),
        "train": train,
        "args": {"n": len(args), "scalars": scalars},
        "optimizer": optimizer_to_json(optimizer) if optimizer is not None else None,
        "steps": steps,
        "state_dict": [tk.to_json() for tk in describe_torch(torch_module)],
        "calls": [[c.path, c.method, c.index] for c in cap.calls],
        "modules": module_kinds(torch_module),  # what declared activation layouts match by
        "envelope": {"seeds": list(envelope_seeds), **env},
        "file": path.name,
    }
    write_manifest(Path(out), {name: section})
    return path


def _run_reference(module, args, optimizer, steps, seed, envelope_seeds):
    """(the capture, the step history, the envelope as JSON: per call index, per gradient key,
    per `t/key` of the steps) of the reference and of its one-ulp perturbed copies."""
    from parity.capture import capture_torch
    from parity.check import envelope
    from parity.envelope import perturbed_copies
    from parity.steps import _steps_envelope, torch_steps

    runs = [(m, copy.deepcopy(m)) for m in perturbed_copies(module, envelope_seeds)]
    trained = copy.deepcopy(module)  # the steps start from the same weights as the capture
    cap = capture_torch(module, args, grads=True, seed=seed)
    history = torch_steps(trained, args, optimizer, steps, seed=seed) if steps else []
    if not runs:
        return cap, history, {}
    calls = envelope(cap, [capture_torch(m, args, grads=True, seed=seed) for m, _ in runs])
    moved = [torch_steps(m, args, optimizer, steps, seed=seed) for _, m in runs] if steps else []
    step_moves = _steps_envelope(history, moved)
    return (
        cap,
        history,
        {
            "calls": [calls[c.key] for c in cap.calls],
            "grads": {k: calls[k] for k in cap.grads},
            "steps": {f"{t}/{k}": v for (t, k), v in step_moves.items()},
        },
    )


def _split_args(args: Sequence) -> tuple[dict[int, object], dict[str, object]]:
    tensors, scalars = {}, {}
    for i, a in enumerate(args):
        if hasattr(a, "detach"):
            tensors[i] = a
        elif a is None or isinstance(a, (bool, int, float, str)):
            scalars[str(i)] = a
        else:
            raise TypeError(
                f"record: argument {i} is a {type(a).__name__}; goldens take tensors and Python "
                "scalars (bool, int, float, str, None)"
            )
    return tensors, scalars


def load(out: Path, name: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(the manifest section, the arrays) of golden NAME in OUT."""
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    if name not in manifest:
        raise KeyError(f"{Path(out) / 'manifest.json'} has no section {name!r}: {sorted(manifest)}")
    section = manifest[name]
    arrays = load_npz(Path(out) / section["file"])
    return section, {k.removesuffix("@bf16"): v for k, v in arrays.items()}


def _under(arrays: dict, prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}


def _calls(section: dict, arrays: dict) -> list[Call]:
    out = []
    for i, (path, method, index) in enumerate(section["calls"]):
        ins = _under(arrays, f"calls/{i}/in/")
        outs = _under(arrays, f"calls/{i}/out/")
        out.append(
            Call(
                path,
                method,
                index,
                [ins[str(j)] for j in range(len(ins))],
                [outs[str(j)] for j in range(len(outs))],
            )
        )
    return out


def check(
    out: Path, name: str, port, *, tol: Tolerance | None = None, rename=None, jit: bool = False
) -> Report:
    """The NNX `port` against golden NAME in OUT, without torch: the stored weights loaded by
    rule, then every module's output, the buffers after the call, every gradient and the
    optimizer steps (each from the stored weights). The bound is FLOAT64 for a float64 golden,
    else FLOAT32, unless `tol` is given."""
    import jax.numpy as jnp

    section, arrays = load(out, name)
    tol = tol or (FLOAT64 if section["dtype"] == "float64" else FLOAT32)
    described = [TorchKey.from_json(d) for d in section["state_dict"]]
    km = build_keymap(described, port, rename=rename).check(f"golden {name!r} state_dict")
    weights = _under(arrays, "weights/")
    args = _args(section, arrays, jnp)
    km.load(port, weights)
    port.train() if section["train"] else port.eval()
    mine = capture_nnx(port, args, grads=True, jit=jit, rename=rename, seed=section["seed"])
    reference = _calls(section, arrays)
    env = section.get("envelope", {})
    by_call = {c.key: v for c, v in zip(reference, env.get("calls", []))}
    layouts = declared_layouts(section.get("modules", {}))
    rows, notes = compare_calls(mine.calls, reference, widened(tol, by_call), layouts=layouts)
    buffers = {tk.key for tk in described if not tk.parameter}
    state = {k: v for k, v in _under(arrays, "state/").items() if k in buffers}
    rows += compare_named("state", km.to_torch(mine.state), state, lambda _: tol)
    grads = {tk.key: arrays[f"grads/{tk.key}"] for tk in described if f"grads/{tk.key}" in arrays}
    rows += compare_named(
        "grads", km.to_torch(mine.grads), grads, widened(tol, env.get("grads", {}))
    )
    if section["steps"]:
        km.load(port, weights)
        opt = optimizer_from_json(section["optimizer"])
        history = nnx_steps(port, args, opt, section["steps"], seed=section["seed"])
        reference = [
            (arrays[f"steps/{t}/loss"], _under(arrays, f"steps/{t}/"))
            for t in range(1, section["steps"] + 1)
        ]
        reference = [(loss, {k: v for k, v in s.items() if k != "loss"}) for loss, s in reference]
        ported = [(np.asarray(loss), km.to_torch(s)) for loss, s in history]
        env_steps = {_step_key(k): v for k, v in env.get("steps", {}).items()}
        rows += steps_report(ported, reference, by_step(widened(tol, env_steps))).rows
    return Report(rows, notes)


def _step_key(k: str) -> tuple[int, str]:
    t, _, key = k.partition("/")
    return int(t), key


def _args(section: dict, arrays: dict, jnp) -> tuple:
    tensors = _under(arrays, "args/")
    scalars = section["args"]["scalars"]
    return tuple(
        jnp.asarray(tensors[str(i)]) if str(i) in tensors else scalars[str(i)]
        for i in range(section["args"]["n"])
    )
