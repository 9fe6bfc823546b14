"""Compile the real train step for a TPU slice on a machine without one (ahead of time).

    python -m train.aot +experiment=trm_sudoku mesh=v4-64
    python -m train.aot +experiment=gpt2_124m mesh=v4-64 --json gpt2_aot.json
    python -m train.aot +experiment=trm_sudoku mesh=v4-64 --topology v6e-32   # another 32-chip slice

Same Hydra configs and overrides as `python -m train.main`. libtpu (this project's `tpu` extra:
`pip install -e '.[tpu]'`) describes the slice's topology —
32 abstract TPU v4 chips in a 2x4x4 block, 8 processes of 4 — without any TPU attached; the trainer
builds the configured mesh over those abstract devices, its step with the real shardings and
donation (`train.jit.build_train_step`), and XLA's TPU compiler compiles it exactly as on the pod.
That gives, before paying for a slice:

* per-device memory (arguments, outputs, temporaries, generated code) against the chip's HBM;
  the command exits 1 with a message when the step does not fit, as MaxText's train_compile does;
* the collectives XLA inserted, counted by kind from the compiled HLO (each op in the program text
  counts once, so one inside a scan/while body counts once however often it runs);
* FLOPs per step, analytic from the task, next to XLA's own cost analysis of the program (FLOPs,
  bytes accessed, and `optimal_seconds`, the TPU compiler's run-time estimate), and from them a
  PREDICTED step time and MFU: the compiler's time where it covers the step, else the roofline of
  XLA's counts (docs/tpu_runbook.md, "Cost"). A prediction until a TPU measures it. The cost
  analysis counts the body of a while loop (lax.scan, fori_loop) once however often it runs, so
  the report says how many loops the program has.

The command prints the prediction and the memory per chip in words (`format_summary`); `--verbose`
prints every term (`format_report`).

Everything here except `topology_devices`/`main` also works on CPU-compiled steps (tests use 8
fake CPU devices): `count_collectives`, `count_loops`, `count_conditionals`, `memory_stats`,
`cost_stats`, `format_report`, `format_summary`.
"""

from __future__ import annotations

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
from train.config import ConfigError
from train.errors import OneLineParser
from train.families import family, make_task
from train.flops import peak_flops_for
from train.jit import build_train_step

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice as libtpu's topology description knows it (no TPU needed)."""

    topology_name: str  # libtpu's "<generation>:<chip grid>"
    chip_config: str  # "megacore": one JAX device per chip of two TensorCores (v4, v5p)
    wrap: tuple[bool, bool, bool]  # wraparound links per dimension
    hbm_bytes: int  # per chip
    hbm_bandwidth: float  # bytes/s per chip
    chip: str  # train.flops.PEAK_FLOPS name of its bf16 peak


# Slices we can describe, by Cloud TPU accelerator type. v4 and v5p names count TensorCores (two
# per chip), v5e (GCE: v5litepod) and v6e names count chips. HBM capacity and bandwidth per chip
# from the Cloud TPU system-architecture pages (v4: 32 GiB, 1200 GB/s; v5e: 16 GB, 819 GB/s;
# v5p: 95 GB, 2765 GB/s; v6e: 32 GB, 1638 GB/s; capacities taken as GiB). The 32-chip slices
# (v4-64, v5e-32, v5p-64, v6e-32) take the `mesh=v4-64` config (32 devices) as it is.
V4_HBM_BYTES = 32 * GiB
_V4 = dict(chip_config="megacore", hbm_bytes=V4_HBM_BYTES, hbm_bandwidth=1200e9, chip="TPU v4")
_NO_WRAP = (False, False, False)
TOPOLOGIES = {
    "v4-8": Slice("v4:2x2x1", wrap=_NO_WRAP, **_V4),
    "v4-16": Slice("v4:2x2x2", wrap=_NO_WRAP, **_V4),
    "v4-32": Slice("v4:2x2x4", wrap=_NO_WRAP, **_V4),
    "v4-64": Slice("v4:2x4x4", wrap=_NO_WRAP, **_V4),
    "v4-128": Slice("v4:4x4x4", wrap=(True, True, True), **_V4),
    "v5e-32": Slice("v5e:4x8", "default", _NO_WRAP, 16 * GiB, 819e9, "TPU v5e"),
    "v5p-64": Slice("v5:2x4x4", "megacore", _NO_WRAP, 95 * GiB, 2765e9, "TPU v5p"),
    "v6e-32": Slice("v6e:4x8", "default", _NO_WRAP, 32 * GiB, 1638e9, "TPU v6e"),
}

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


# `%name = <shape> while(<init>), condition=..., body=...`: one per lax.scan / fori_loop / while_loop
# that XLA kept as a loop (it unrolls some; a trip count of 1 disappears).
_WHILE_RE = re.compile(r"(?<=\s)while\(")


def count_loops(hlo_text: str) -> int:
    """Number of while loops in an HLO module's text. XLA's cost analysis counts each body once."""
    return len(_WHILE_RE.findall(hlo_text))


_CONDITIONAL_RE = re.compile(r"(?<=\s)conditional\(")


def count_conditionals(hlo_text: str) -> int:
    """Number of conditionals (lax.cond / lax.switch kept as such) in an HLO module's text."""
    return len(_CONDITIONAL_RE.findall(hlo_text))


# XLA:TPU has no float64: where a 64-bit value crosses the program's boundary it is split into a
# pair of 32-bit values (and joined back) by these custom calls; inside, no 64-bit type remains.
_X64_RE = re.compile(r'custom_call_target="X64(?:SplitHigh|SplitLow|Combine)"')


def count_x64_emulation(hlo_text: str) -> int:
    """Custom calls XLA:TPU inserted to emulate 64-bit values with 32-bit pairs (0 elsewhere)."""
    return len(_X64_RE.findall(hlo_text))


def entry_computation(hlo_text: str) -> str:
    """The ENTRY computation of an HLO module's text (its top level; '' when there is none)."""
    start = hlo_text.find("\nENTRY ")
    if start < 0:
        return ""
    end = hlo_text.find("\n}", start)
    return hlo_text[start : end if end >= 0 else len(hlo_text)]


def count_entry_custom_calls(hlo_text: str) -> int:
    """Custom calls at the program's top level. XLA:TPU's `optimal_seconds` counts each as -1 s
    (it cannot time them); those inside fusions are timed with their fusion."""
    return entry_computation(hlo_text).count(" custom-call(")


@dataclasses.dataclass(frozen=True)
class CostStats:
    """XLA's cost analysis of one compiled program, per device (`compiled.cost_analysis()`).

    Every count covers a while loop's body ONCE however many times it runs. `optimal_seconds` is
    XLA:TPU's own estimate of the program's run time, None where the backend reports none (CPU).
    It counts each top-level custom call as -1 s (`untimed_ops` of them), and it does not cover
    the branches of a conditional (docs/tpu_runbook.md, "optimal_seconds is not a step time").
    """

    flops: float | None
    bytes_accessed: float | None
    optimal_seconds: float | None
    untimed_ops: int = 0

    @property
    def compiler_seconds(self) -> float | None:
        """`optimal_seconds` with its untimed custom calls counted as free instead of -1 s."""
        if self.optimal_seconds is None:
            return None
        return self.optimal_seconds + self.untimed_ops


def cost_stats(compiled, hlo_text: str | None = None) -> CostStats:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - cost analysis is optional and backend-dependent
        cost = None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    cost = cost or {}

    def get(key):
        return float(cost[key]) if key in cost else None

    hlo_text = compiled.as_text() if hlo_text is None else hlo_text
    return CostStats(
        flops=get("flops"),
        bytes_accessed=get("bytes accessed"),
        optimal_seconds=get("optimal_seconds"),
        untimed_ops=count_entry_custom_calls(hlo_text),
    )


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
    cost: CostStats  # XLA's cost analysis, per device (loop bodies counted once)
    loops: int  # while loops in the compiled program
    conditionals: int  # conditionals in the compiled program
    x64_emulation_calls: int  # XLA:TPU's 64-bit-as-32-bit-pairs custom calls
    peak_flops_per_device: float
    hbm_bandwidth: float | None  # bytes/s per device, for the roofline (None: no roofline)
    lower_seconds: float
    compile_seconds: float

    @property
    def fits(self) -> bool:
        return self.memory.required <= self.hbm_bytes

    def step_seconds_at(self, mfu: float) -> float:
        return self.flops_per_step / (self.num_devices * self.peak_flops_per_device * mfu)

    @property
    def flop_floor_seconds(self) -> float | None:
        """XLA's FLOPs per device at the chip's peak: no step of this program can be faster."""
        if self.cost.flops is None:
            return None
        return self.cost.flops / self.peak_flops_per_device

    @property
    def roofline_seconds(self) -> float | None:
        """max(XLA's FLOPs at peak, XLA's bytes accessed at the HBM bandwidth), per device."""
        if self.cost.flops is None or self.cost.bytes_accessed is None or not self.hbm_bandwidth:
            return None
        return max(self.flop_floor_seconds, self.cost.bytes_accessed / self.hbm_bandwidth)

    @property
    def compiler_time_usable(self) -> bool:
        """The compiler's time stands for the step only in a program without loops (bodies once)
        and conditionals (branches not covered), and when it is not below the FLOP floor."""
        t, floor = self.cost.compiler_seconds, self.flop_floor_seconds
        if t is None or t <= 0 or self.loops or self.conditionals:
            return False
        return floor is None or t >= floor

    @property
    def prediction_source(self) -> str | None:
        """ "compiler" (its optimal_seconds), "roofline" (of XLA's counts) or None."""
        if self.compiler_time_usable:
            return "compiler"
        return "roofline" if self.roofline_seconds is not None else None

    @property
    def predicted_step_seconds(self) -> float | None:
        """A PREDICTION until a TPU measures it: the compiler's time where usable, else the
        roofline of XLA's counts. Low when the program has loops (their bodies count once)."""
        if self.prediction_source == "compiler":
            return self.cost.compiler_seconds
        return self.roofline_seconds

    @property
    def predicted_mfu(self) -> float | None:
        """Analytic FLOPs per step over (devices x peak x predicted step time)."""
        t = self.predicted_step_seconds
        return None if t is None else self.step_seconds_at(1.0) / t

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["memory"]["total"] = self.memory.total
        d["fits"] = self.fits
        d["cost"]["compiler_seconds"] = self.cost.compiler_seconds
        for key in (
            "flop_floor_seconds",
            "roofline_seconds",
            "prediction_source",
            "predicted_step_seconds",
            "predicted_mfu",
        ):
            d[key] = getattr(self, key)
        return d


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.3g} us"


def _why_not(r: AOTReport) -> str:
    if r.loops or r.conditionals:
        parts = [
            f"{n} {what}"
            for n, what in ((r.loops, "loop(s)"), (r.conditionals, "conditional(s)"))
            if n
        ]
        return f"the program has {' and '.join(parts)}"
    if r.cost.compiler_seconds <= 0:
        return "not > 0"
    return f"below the FLOP floor {_ms(r.flop_floor_seconds)}"


def _prediction_lines(r: AOTReport) -> list[str]:
    c, lines = r.cost, []
    if c.compiler_seconds is not None:
        verdict = "used" if r.compiler_time_usable else f"NOT used: {_why_not(r)}"
        lines.append(
            f"  compiler's time: optimal_seconds {c.optimal_seconds:.6g} + {c.untimed_ops} "
            f"untimed custom calls = {_ms(c.compiler_seconds)}, {verdict}"
        )
    if r.roofline_seconds is not None:
        lines.append(
            f"  roofline of XLA's counts: FLOPs {_ms(r.flop_floor_seconds)}, bytes "
            f"{_ms(c.bytes_accessed / r.hbm_bandwidth)} at {r.hbm_bandwidth / 1e9:.0f} GB/s"
        )
    t = r.predicted_step_seconds
    if t is not None:
        lines.append(
            f"  PREDICTED step {_ms(t)} ({r.prediction_source}), MFU "
            f"{100 * r.predicted_mfu:.1f}%: a prediction until a TPU measures it"
        )
    return lines


def _cost_lines(r: AOTReport) -> list[str]:
    c, n = r.cost, r.num_devices
    lines = [f"  FLOPs per step: {r.flops_per_step:.4g} analytic (model matmuls, whole step)"]
    if c.flops is not None:
        accessed = f", {c.bytes_accessed / 1e9:.4g} GB accessed" if c.bytes_accessed else ""
        lines.append(
            f"  XLA cost analysis per device: {c.flops:.4g} FLOPs (x {n} = {c.flops * n:.4g})"
            f"{accessed}"
        )
    lines.append(
        f"  step time at 100% / 50% / 30% MFU: {_ms(r.step_seconds_at(1.0))} / "
        f"{_ms(r.step_seconds_at(0.5))} / {_ms(r.step_seconds_at(0.3))}"
    )
    lines += _prediction_lines(r)
    if r.loops:
        lines.append(
            f"  loops: {r.loops} while loop(s); XLA's counts and the prediction include each "
            "body ONCE"
        )
    else:
        lines.append("  loops: none (XLA's counts cover the whole step)")
    if r.conditionals:
        lines.append(
            f"  conditionals: {r.conditionals} (optimal_seconds does not cover their branches)"
        )
    if r.x64_emulation_calls:
        lines.append(f"  64-bit emulation: {r.x64_emulation_calls} X64 split/combine custom calls")
    return lines


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
        *_cost_lines(r),
        "  FITS" if r.fits else f"  DOES NOT FIT: needs {_fmt_bytes(m.required)} per device",
    ]
    return "\n".join(lines)


def _size(n: float) -> str:
    """888 MiB, 1.4 GiB, 32 GiB: three significant digits."""
    return f"{n / GiB:.3g} GiB" if abs(n) >= GiB else f"{n / 2**20:.3g} MiB"


def format_summary(r: AOTReport) -> str:
    """The report in words (the command's default output; `format_report` is --verbose's):
    the predicted step time and MFU, the memory per chip, whether it fits."""
    m = r.memory
    source = {"compiler": "XLA's cost model", "roofline": "the roofline of XLA's counts"}
    lines = [f"{r.name} on a {r.topology} ({r.num_devices} devices), compiled in "
             f"{r.lower_seconds + r.compile_seconds:.0f} s:"]  # fmt: skip
    t = r.predicted_step_seconds
    if t is not None:
        lines.append(
            f"  {source[r.prediction_source]} predicts {_ms(t)} per step on a {r.topology} "
            f"({100 * r.predicted_mfu:.1f}% MFU): a prediction until a TPU measures it"
        )
        if r.prediction_source == "roofline":
            lines.append(f"  (the compiler's own estimate does not cover this step: {_why_not(r)})")
        if r.loops:
            lines.append(f"  {r.loops} loop(s): each body counted once, so the step takes longer")
    fits = "fits" if r.fits else "DOES NOT FIT"
    lines.append(f"  {_size(m.required)} of {_size(r.hbm_bytes)} per chip: {fits}")
    gathered = {k: v for k, v in r.collectives.items() if v}
    if gathered:
        lines.append("  collectives: " + ", ".join(f"{v} {k}" for k, v in gathered.items()))
    lines.append("  --verbose: memory by kind, XLA's counts and the terms of the prediction")
    return "\n".join(lines)


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
    hbm_bandwidth: float | None = None,
    lower_seconds: float = 0.0,
    compile_seconds: float = 0.0,
) -> AOTReport:
    hlo = compiled.as_text()
    return AOTReport(
        name=name,
        topology=topology,
        num_devices=int(mesh.devices.size),
        mesh_shape={k: int(v) for k, v in mesh.shape.items()},
        memory=memory_stats(compiled),
        hbm_bytes=hbm_bytes,
        collectives=count_collectives(hlo),
        flops_per_step=float(flops_per_step),
        cost=cost_stats(compiled, hlo),
        loops=count_loops(hlo),
        conditionals=count_conditionals(hlo),
        x64_emulation_calls=count_x64_emulation(hlo),
        peak_flops_per_device=peak_flops_per_device,
        hbm_bandwidth=hbm_bandwidth,
        lower_seconds=lower_seconds,
        compile_seconds=compile_seconds,
    )


# --- TPU topology ------------------------------------------------------------------------------


def _quiet_libtpu(topology: str) -> None:
    # Off a TPU VM libtpu would query the GCE metadata server (and warn) and take
    # /tmp/libtpu_lockfile, which makes a second process (pytest -n 2) fail to load it. Without an
    # accelerator type it warns that it cannot find the host bounds; without worker hostnames it
    # takes its own warning for a hostname and logs an INVALID_ARGUMENT error: a compile here is
    # local, its one worker this machine.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", topology.replace("v5e", "v5litepod"))
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def topology_devices(topology: str = "v4-64"):
    """The abstract devices of a TPU slice, from libtpu's topology description (no TPU needed)."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"--topology {topology!r}: expected one of {sorted(TOPOLOGIES)}")
    if importlib.util.find_spec("libtpu") is None:
        raise ConfigError(
            "libtpu is not importable: install this project's tpu extra, pip install -e '.[tpu]' "
            f"(jax[tpu], the libtpu of jax {jax.__version__}), or pip install "
            f"'jax[tpu]=={jax.__version__}'"
        )
    _quiet_libtpu(topology)  # before libtpu loads (get_topology_desc)
    spec = TOPOLOGIES[topology]
    desc = topologies.get_topology_desc(
        platform="tpu",
        topology_name=spec.topology_name,
        chip_config_name=spec.chip_config,
        chips_per_host_bounds=(2, 2, 1),
        wrap=spec.wrap,
    )
    return list(desc.devices)


def _name(overrides: Sequence[str], cfg) -> str:
    """The experiment the overrides name, else the config's family."""
    return next(
        (o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("experiment=")),
        cfg.family,
    )


def aot_compile(
    overrides: Sequence[str],
    *,
    topology: str = "v4-64",
    hbm_bytes: int | None = None,
    announce: bool = False,
) -> AOTReport:
    """Compose the config, build the real step on the topology's mesh, compile, analyse.
    `hbm_bytes`: what the step must fit in per device (default: the slice's chip). `announce`:
    print a line saying what is compiled, before the compile."""
    cfg = load_config(list(overrides))  # exactly as train.main composes and validates it
    # as the trainer does on the slice (every slice in TOPOLOGIES is a TPU), before libtpu loads
    family(cfg.family).task.check_backend(cfg, "tpu")
    spec = TOPOLOGIES.get(topology)
    devices = topology_devices(topology)
    mesh = mesh_lib.make_mesh(cfg.mesh, devices=devices)
    batch = {"trainer.global_batch_size": int(cfg.trainer.global_batch_size)}
    mesh_lib.check_batch_divisible(mesh, cfg.mesh.rules, batch)  # the trainer's line, not JAX's
    if announce:
        print(
            f"train.aot: compiling {_name(overrides, cfg)}'s train step for a {topology} "
            f"({len(devices)} devices) with XLA's TPU compiler on this CPU: minutes for a "
            "production model",
            flush=True,
        )
    # as train.trainer.train (x64 on when needed); need_data=False: sizes that come from the dataset (vocab, seq_len, ids) come from the config
    task = make_task(cfg, mesh, need_data=False)
    jitted, abstract_args = build_train_step(cfg, mesh, task=task)
    compiled, t_lower, t_compile = compile_step(jitted, abstract_args, mesh)
    return analyze(
        compiled,
        name=_name(overrides, cfg),
        topology=topology,
        mesh=mesh,
        flops_per_step=task.flops_per_step,
        hbm_bytes=spec.hbm_bytes if hbm_bytes is None else hbm_bytes,
        peak_flops_per_device=peak_flops_for(spec.chip),
        hbm_bandwidth=spec.hbm_bandwidth,
        lower_seconds=t_lower,
        compile_seconds=t_compile,
    )


def _explain_failure(message: str) -> str:
    """One line on what a compile failure means for the run (tested on the real messages)."""
    if "memory space vmem" in message:
        return (
            "the step does NOT compile: one op needs more on-chip vector memory (vmem) than the "
            "TPU has; this is not HBM capacity, a smaller batch will not help"
        )
    if "RESOURCE_EXHAUSTED" in message or "out of memory" in message.lower():
        return "the step does NOT fit in device memory (compile-time OOM)"
    return "the step could not be built or compiled (see the error above)"


def main(argv: Sequence[str] | None = None) -> int:
    p = OneLineParser(
        prog="python -m train.aot",
        description="Compile the train step for a TPU slice without a TPU; print memory, "
        "collectives, FLOPs and the compiler's predicted step time. Arguments without -- are "
        "Hydra overrides, as for train.main.",
    )
    p.add_argument("--topology", default="v4-64", choices=sorted(TOPOLOGIES))
    p.add_argument("--json", help="also write the report as JSON to this path")
    p.add_argument("--verbose", action="store_true",
                   help="the whole report: memory by kind, XLA's counts, the prediction's terms")  # fmt: skip
    p.add_argument(
        "--hbm-gib",
        type=float,
        help="device memory to fit in (default: the slice's chip, 32 GiB on a v4; lower it to keep "
        "headroom)",
    )
    args, overrides = p.parse_known_args(argv)
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        p.error(f"unknown option(s) {bad}")
    try:
        hbm = None if args.hbm_gib is None else int(args.hbm_gib * GiB)
        report = aot_compile(overrides, topology=args.topology, hbm_bytes=hbm, announce=True)
    except ConfigError as e:  # one line naming the key
        print(f"train.aot: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - a compile OOM/config error is the answer, say it clearly
        print(f"train.aot: {type(e).__name__}: {e}", file=sys.stderr)
        print(f"train.aot: {_explain_failure(str(e))}", file=sys.stderr)
        return 1
    print(format_report(report) if args.verbose else format_summary(report))
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
