"""Compile the real train step for a TPU slice on a machine without one (ahead of time).

    python -m train.aot +experiment=trm_sudoku mesh=v4-64 optim.loss_dtype=float32
    python -m train.aot +experiment=gpt2_124m mesh=v4-64 --json gpt2_aot.json

Same Hydra configs and overrides as `python -m train.main`. libtpu (`pip install
'jax[tpu]==0.10.2'`, or just the `libtpu==0.0.42.*` wheel) describes the slice's topology —
32 abstract TPU v4 chips in a 2x4x4 block, 8 processes of 4 — without any TPU attached; the trainer
builds the configured mesh over those abstract devices, its step with the real shardings and
donation (`train.jit.build_train_step`), and XLA's TPU compiler compiles it exactly as on the pod.
That gives, before paying for a slice:

* per-device memory (arguments, outputs, temporaries, generated code) against the chip's 32 GiB;
  the command exits 1 with a message when the step does not fit, as MaxText's train_compile does;
* the collectives XLA inserted, counted by kind from the compiled HLO (each op in the program text
  counts once, so one inside a scan/while body counts once however often it runs);
* FLOPs per step, analytic from the task (XLA's cost_analysis counts a loop body once, so it is
  printed only as a cross-check), and the step time at a given MFU.

Everything here except `topology_devices`/`main` also works on CPU-compiled steps (tests use 8
fake CPU devices): `count_collectives`, `memory_stats`, `format_report`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Sequence

import jax
from jax.experimental import topologies

from train import mesh as mesh_lib
from train.compose import load_config
from train.families import enable_x64_if_needed, make_task
from train.flops import peak_flops_for
from train.jit import build_train_step

GiB = 2**30

# Slices we can describe. v4 names count TensorCores; "megacore" makes one JAX device per chip.
TOPOLOGIES = {
    "v4-8": dict(topology_name="v4:2x2x1", wrap=(False, False, False)),
    "v4-16": dict(topology_name="v4:2x2x2", wrap=(False, False, False)),
    "v4-32": dict(topology_name="v4:2x2x4", wrap=(False, False, False)),
    "v4-64": dict(topology_name="v4:2x4x4", wrap=(False, False, False)),
    "v4-128": dict(topology_name="v4:4x4x4", wrap=(True, True, True)),
}
V4_HBM_BYTES = 32 * GiB

COLLECTIVE_KINDS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)
# An HLO instruction is `%name = <shape> <opcode>(<operands>), ...`; the opcode is preceded by a
# space and followed by '('. Async pairs appear as <kind>-start / <kind>-done: count the start.
# Operand references are `%name` (preceded by '%'), so they never match.
_COLLECTIVE_RE = re.compile(
    r"(?<=\s)(" + "|".join(re.escape(k) for k in COLLECTIVE_KINDS) + r")(-start)?\("
)


def count_collectives(hlo_text: str) -> dict[str, int]:
    """Number of collective ops of each kind in an HLO module's text (static count)."""
    counts = dict.fromkeys(COLLECTIVE_KINDS, 0)
    for m in _COLLECTIVE_RE.finditer(hlo_text):
        counts[m.group(1)] += 1
    return counts


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Per-device bytes of one compiled program (from `compiled.memory_analysis()`)."""

    argument: int
    output: int
    alias: int  # output bytes that reuse donated argument buffers
    temp: int
    code: int
    peak: int  # the compiler's own peak estimate, 0 where the backend does not report one

    @property
    def total(self) -> int:
        """Live at once: arguments + outputs not aliased to them + temporaries + program."""
        return self.argument + self.output - self.alias + self.temp + self.code

    @property
    def required(self) -> int:
        return max(self.total, self.peak)


def memory_stats(compiled) -> MemoryStats:
    m = compiled.memory_analysis()
    if m is None:
        raise RuntimeError("this backend reports no memory analysis for compiled programs")
    return MemoryStats(
        argument=int(m.argument_size_in_bytes),
        output=int(m.output_size_in_bytes),
        alias=int(m.alias_size_in_bytes),
        temp=int(m.temp_size_in_bytes),
        code=int(m.generated_code_size_in_bytes),
        peak=int(getattr(m, "peak_memory_in_bytes", 0) or 0),
    )


def _fmt_bytes(n: float) -> str:
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / 2**20:.1f} MiB"


@dataclasses.dataclass
class AOTReport:
    name: str  # experiment / config label
    topology: str
    num_devices: int
    mesh_shape: dict[str, int]
    memory: MemoryStats
    hbm_bytes: int
    collectives: dict[str, int]
    flops_per_step: float  # analytic, whole step, all devices
    xla_flops_per_device: float | None  # cost_analysis (loop bodies counted once)
    peak_flops_per_device: float
    lower_seconds: float
    compile_seconds: float

    @property
    def fits(self) -> bool:
        return self.memory.required <= self.hbm_bytes

    def step_seconds_at(self, mfu: float) -> float:
        return self.flops_per_step / (self.num_devices * self.peak_flops_per_device * mfu)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["memory"]["total"] = self.memory.total
        d["fits"] = self.fits
        return d


def format_report(r: AOTReport) -> str:
    m = r.memory
    mesh = " x ".join(f"{k}={v}" for k, v in r.mesh_shape.items())
    lines = [
        f"AOT compile of {r.name} for {r.topology} ({r.num_devices} devices, mesh {mesh})",
        f"  lower {r.lower_seconds:.1f} s, compile {r.compile_seconds:.1f} s",
        "  memory per device:",
        f"    arguments    {_fmt_bytes(m.argument):>12}",
        f"    outputs      {_fmt_bytes(m.output):>12}  ({_fmt_bytes(m.alias)} aliased to donated arguments)",
        f"    temporaries  {_fmt_bytes(m.temp):>12}",
        f"    code         {_fmt_bytes(m.code):>12}",
        f"    total        {_fmt_bytes(m.total):>12}  of {_fmt_bytes(r.hbm_bytes)} "
        f"({100 * m.total / r.hbm_bytes:.1f}%)"
        + (f"; compiler peak {_fmt_bytes(m.peak)}" if m.peak else ""),
        "  collectives (ops in the program; one inside a loop body counts once):",
        *(f"    {k:<20} {v}" for k, v in r.collectives.items()),
        f"  FLOPs per step: {r.flops_per_step:.4g} analytic"
        + (
            f"; XLA cost_analysis {r.xla_flops_per_device * r.num_devices:.4g}"
            f" ({r.xla_flops_per_device:.4g} per device x {r.num_devices}, loop bodies once)"
            if r.xla_flops_per_device
            else ""
        ),
        f"  step time at 100% / 50% / 30% MFU: {r.step_seconds_at(1.0) * 1e3:.2f} / "
        f"{r.step_seconds_at(0.5) * 1e3:.2f} / {r.step_seconds_at(0.3) * 1e3:.2f} ms",
        "  FITS" if r.fits else f"  DOES NOT FIT: needs {_fmt_bytes(m.required)} per device",
    ]
    return "\n".join(lines)


def _xla_flops(compiled) -> float | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - cost analysis is optional and backend-dependent
        return None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        return None
    return float(cost["flops"])


def compile_step(jitted, abstract_args, mesh):
    """-> (compiled, lower seconds, compile seconds)."""
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = jitted.lower(*abstract_args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    return compiled, t1 - t0, time.perf_counter() - t1


def analyze(
    compiled,
    *,
    name: str,
    topology: str,
    mesh,
    flops_per_step: float,
    hbm_bytes: int,
    peak_flops_per_device: float,
    lower_seconds: float = 0.0,
    compile_seconds: float = 0.0,
) -> AOTReport:
    return AOTReport(
        name=name,
        topology=topology,
        num_devices=int(mesh.devices.size),
        mesh_shape={k: int(v) for k, v in mesh.shape.items()},
        memory=memory_stats(compiled),
        hbm_bytes=hbm_bytes,
        collectives=count_collectives(compiled.as_text()),
        flops_per_step=float(flops_per_step),
        xla_flops_per_device=_xla_flops(compiled),
        peak_flops_per_device=peak_flops_per_device,
        lower_seconds=lower_seconds,
        compile_seconds=compile_seconds,
    )


# --- TPU topology ------------------------------------------------------------------------------


def _quiet_libtpu() -> None:
    # Off a TPU VM libtpu would query the GCE metadata server (and warn) and take
    # /tmp/libtpu_lockfile, which makes a second process (pytest -n 2) fail to load it.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v4-64")


def topology_devices(topology: str = "v4-64"):
    """The abstract devices of a TPU slice, from libtpu's topology description (no TPU needed)."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"--topology {topology!r}: expected one of {sorted(TOPOLOGIES)}")
    if importlib.util.find_spec("libtpu") is None:
        raise RuntimeError(
            "libtpu is not importable: pip install 'jax[tpu]==<your jax version>' "
            "(for jax 0.10.2: pip install 'libtpu==0.0.42.*')"
        )
    _quiet_libtpu()  # before libtpu loads (get_topology_desc)
    spec = TOPOLOGIES[topology]
    desc = topologies.get_topology_desc(
        platform="tpu",
        topology_name=spec["topology_name"],
        chip_config_name="megacore",
        chips_per_host_bounds=(2, 2, 1),
        wrap=spec["wrap"],
    )
    return list(desc.devices)


def aot_compile(
    overrides: Sequence[str], *, topology: str = "v4-64", hbm_bytes: int = V4_HBM_BYTES
) -> AOTReport:
    """Compose the config, build the real step on the topology's mesh, compile, analyse."""
    devices = topology_devices(topology)

    cfg = load_config(list(overrides))  # exactly as train.main composes and validates it
    enable_x64_if_needed(cfg)  # as train.trainer.train: TRM's float64 stablemax loss
    mesh = mesh_lib.make_mesh(cfg.mesh, devices=devices)
    # need_data=False: sizes that come from the dataset (vocab, seq_len, ids) come from the config
    task = make_task(cfg, mesh, need_data=False)
    jitted, abstract_args = build_train_step(cfg, mesh, task=task)
    compiled, t_lower, t_compile = compile_step(jitted, abstract_args, mesh)
    experiment = next(
        (o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("experiment=")),
        cfg.task,
    )
    return analyze(
        compiled,
        name=experiment,
        topology=topology,
        mesh=mesh,
        flops_per_step=task.flops_per_step,
        hbm_bytes=hbm_bytes,
        peak_flops_per_device=peak_flops_for("TPU v4"),
        lower_seconds=t_lower,
        compile_seconds=t_compile,
    )


def _explain_failure(message: str) -> str:
    """One line on what a compile failure means for the run (tested on the real messages)."""
    if "memory space vmem" in message:
        hint = (
            "the step does NOT compile: one op needs more on-chip vector memory (vmem) than the "
            "TPU has; this is not HBM capacity, a smaller batch will not help"
        )
        if jax.config.jax_enable_x64:
            hint += (
                ". jax x64 is on (TRM's float64 loss): 64-bit ops are emulated on TPU; try "
                "optim.loss_dtype=float32 (docs/sharding.md)"
            )
        return hint
    if "RESOURCE_EXHAUSTED" in message or "out of memory" in message.lower():
        return "the step does NOT fit in device memory (compile-time OOM)"
    return "the step could not be built or compiled (see the error above)"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m train.aot",
        description="Compile the train step for a TPU slice without a TPU; print memory, "
        "collectives and FLOPs. Arguments without -- are Hydra overrides, as for train.main.",
    )
    p.add_argument("--topology", default="v4-64", choices=sorted(TOPOLOGIES))
    p.add_argument("--json", help="also write the report as JSON to this path")
    p.add_argument(
        "--hbm-gib",
        type=float,
        default=V4_HBM_BYTES / GiB,
        help="device memory to fit in (default: a v4 chip's 32 GiB; lower it to keep headroom)",
    )
    args, overrides = p.parse_known_args(argv)
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        p.error(f"unknown option(s) {bad}")
    try:
        report = aot_compile(overrides, topology=args.topology, hbm_bytes=int(args.hbm_gib * GiB))
    except Exception as e:  # noqa: BLE001 - a compile OOM/config error is the answer, say it clearly
        print(f"train.aot: {type(e).__name__}: {e}", file=sys.stderr)
        print(f"train.aot: {_explain_failure(str(e))}", file=sys.stderr)
        return 1
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
    if not report.fits:
        print(
            f"train.aot: {report.name} needs {_fmt_bytes(report.memory.required)} per device, "
            f"more than the {_fmt_bytes(report.hbm_bytes)} of a {report.topology} chip",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
