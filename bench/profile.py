"""Where a train step spends its time: a profiler trace, summarised per op.

    python -m bench.profile --trace RUN_DIR/profile --steps 3    # a trainer run's own steps
    python -m bench.profile trm_sudoku_tiny [--impl jax|torch_eager|torch_compile] [--threads 1]
        [--steps 3] [--top 25] [--trace-dir DIR] [--hlo FILE] [--jax-model K=V ...]
        [--data K=V ...] [--data-path DIR] [--device cpu|gpu]

Runs the trainer's real step (the same `bench.runners.JaxRunner` the benchmark times), warms it
up, traces `--steps` steps with `jax.profiler`, and prints the op time per step grouped by XLA
op name (numeric and `.clone` suffixes dropped: `ynn_fusion.12` -> `ynn_fusion`). Control-flow thunks
(`cond`, `while`, `call`) are containers: their events span their branch's ops, so they are
left out of the sum and each leaf op is marked `in cond/while` when it ran inside one (summing
all events double counts; docs/benchmarks.md, "Traps"). `--hlo FILE` writes the optimised HLO
of the step, to look up what a fusion computes. Used for the findings in docs/benchmarks.md.

`--impl torch_eager` / `torch_compile` profiles the PyTorch reference's step instead (the same
`bench.runners` torch runner the benchmark times, on the same batch) with torch.profiler and prints
the same table per kernel: on a GPU the CUDA kernels' own time (torch.compile's fused Triton
kernels by name, `triton_per_fused_...`), on the CPU the operators' self time. Put beside the JAX
table of the same config, it shows which work one side fuses and the other does not.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile

from train.errors import user_errors

_CONTAINERS = ("cond", "while", "call")
# XLA:GPU replays runs of kernels as CUDA graphs; a trace then shows one `command_buffer` event
# per graph instead of its ops. Off for a profile (the traced trm_sudoku step on an H100: 240 ms
# with them, 230 ms without).
NO_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer="


def _op_name(hlo_op: str) -> str:
    """`ynn_fusion.12` -> `ynn_fusion`, `cond.1.clone` -> `cond`."""
    return re.sub(r"(\.\d+|\.clone)+$", "", hlo_op)


def op_events(trace_file: str) -> list[dict]:
    """The trace's XLA op events: complete events carrying an `hlo_op` argument."""
    with gzip.open(trace_file) as f:
        return [
            e
            for e in json.load(f)["traceEvents"]
            if e.get("ph") == "X" and "hlo_op" in (e.get("args") or {})
        ]


def without_command_buffers(xla_flags: str) -> str:
    """XLA_FLAGS with XLA:GPU's command buffers off, for a trace that names its ops."""
    return f"{xla_flags} {NO_COMMAND_BUFFERS}".strip()


def summarise(trace_file: str, steps: int) -> tuple[float, list[tuple[str, float, int, bool]]]:
    """(leaf op ms per step, [(op, ms per step, count per step, inside a container)]).

    Op events are the ones carrying an `hlo_op` argument (runtime bookkeeping such as
    `DevicePut` or the thread pool's events has none)."""
    events = op_events(trace_file)
    names = [_op_name(e["args"]["hlo_op"]) for e in events]
    spans = collections.defaultdict(list)  # thread -> [(start, end)] of container thunks
    for e, name in zip(events, names):
        if name in _CONTAINERS:
            spans[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    total = collections.Counter()
    count = collections.Counter()
    for e, name in zip(events, names):
        if name in _CONTAINERS:
            continue
        start, end = e["ts"], e["ts"] + e["dur"]
        inner = any(s <= start and end <= t for s, t in spans[e["tid"]])
        total[(name, inner)] += e["dur"]
        count[(name, inner)] += 1
    rows = [
        (name, us / steps / 1e3, -(-count[(name, inner)] // steps), inner)
        for (name, inner), us in total.most_common()
    ]
    return sum(total.values()) / steps / 1e3, rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("config", nargs="?", help="a bench config name (bench/configs.py)")
    p.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="summarise the newest trace under DIR instead of running (a trainer run's "
        "<run dir>/profile from trainer.profile_start; --steps = the steps it holds)",
    )
    p.add_argument("--threads", type=int, default=None, help="pin to this many cores")
    p.add_argument("--steps", type=int, default=3, help="traced steps")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--trace-dir", default=None, help="keep the trace here (TensorBoard/Perfetto)")
    p.add_argument("--hlo", default=None, help="write the step's optimised HLO to this file")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument(
        "--impl",
        default="jax",
        choices=("jax", "torch_eager", "torch_compile"),
        help="whose step: the trainer's JAX step, or the PyTorch reference's (torch.profiler)",
    )
    p.add_argument(
        "--jax-model",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a model field changed for this run (scan=true, attention_impl=explicit, ...)",
    )
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a data size as the trainer reads it without data on disk; TRM: "
        "num_puzzle_identifiers=1001001 is the puzzle table of Sudoku-Extreme 1k x 1000 "
        "augmentations (the bench configs have 1 row), and the batch's ids then span it",
    )
    p.add_argument(
        "--data-path",
        default=None,
        metavar="DIR",
        help="the data set the batch comes from (default: the experiment's data.path; without "
        "one on disk, a generator with its token statistics: bench.runners.make_batch)",
    )
    args = p.parse_args(argv)
    if args.trace:
        found = sorted(glob.glob(f"{args.trace}/**/*.trace.json.gz", recursive=True))
        if not found:
            raise SystemExit(f"bench.profile: no *.trace.json.gz under {args.trace}")
        _print_summary(found[-1], args.steps, args.top, "trace")
        return
    if not args.config:
        p.error("a config name, or --trace DIR")

    if args.impl != "jax":
        for flag in ("hlo", "jax_model"):
            if getattr(args, flag):
                p.error(f"--{flag.replace('_', '-')} is for --impl jax")
        return _profile_torch(args)

    from bench.worker import apply_config_xla_flags, prepare_env

    prepare_env("jax", args.device, args.threads)
    if args.device == "gpu":  # docs/benchmarks.md, "A GPU trace shows command_buffer"
        os.environ["XLA_FLAGS"] = without_command_buffers(os.environ["XLA_FLAGS"])
    import jax

    from bench import runners

    rc = _resolved(args)
    print(f"XLA_FLAGS: {apply_config_xla_flags(rc)!r}")  # the trainer's, before the backend starts
    runner = runners.JaxRunner(rc, {"seed": 0, "device": args.device})
    runner.setup()
    runner.run(3)  # compile + warm-up
    if args.hlo:
        with open(args.hlo, "w") as f:
            f.write(runner.step_fn.lower(runner.state, runner.batch).compile().as_text())
        print(f"wrote the optimised HLO to {args.hlo}")
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="bench_profile_")
    jax.profiler.start_trace(trace_dir)
    seconds, _ = runner.run(args.steps)
    jax.profiler.stop_trace()
    trace = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))[-1]
    _print_summary(
        trace,
        args.steps,
        args.top,
        f"{args.config}: {seconds / args.steps * 1e3:.1f} ms per step (traced; batch from "
        f"{runner.batch_source})",
    )


def _resolved(args) -> dict:
    from bench import configs
    from bench.harness import _parse_overrides

    rc = configs.resolve(
        configs.get(args.config),
        jax_overrides=_parse_overrides(args.jax_model),
        data_path=args.data_path,
    )
    for key, value in _parse_overrides(args.data).items():
        rc["trainer_cfg"]["data"][key] = value
        rc["model"][key] = value  # runners.make_batch draws the puzzle ids from it
    return rc


def torch_rows(averages, steps: int, on_gpu: bool) -> tuple[float, list[tuple[str, float, int]]]:
    """torch.profiler's `key_averages()` -> (ms per step, [(name, ms per step, count per step)]).

    On a GPU the rows are the device's kernels (their own time; the CPU-side operators that
    launched them are left out, or every kernel would count twice); on the CPU the operators'
    self time."""
    from torch.autograd import DeviceType

    rows = []
    for e in averages:
        if on_gpu:
            if e.device_type != DeviceType.CUDA:
                continue
            us = e.self_device_time_total
        else:
            us = e.self_cpu_time_total
        if us > 0:
            rows.append((e.key, us / steps / 1e3, -(-e.count // steps)))
    rows.sort(key=lambda r: -r[1])
    return sum(r[1] for r in rows), rows


def _profile_torch(args) -> None:
    from bench.worker import prepare_env

    prepare_env(args.impl, args.device, args.threads)
    from torch.profiler import ProfilerActivity, profile

    from bench import runners

    spec = {"impl": args.impl, "device": args.device, "seed": 0, "resolved": _resolved(args)}
    runner = runners.make_runner(spec)
    source = runner.setup()["batch_source"]
    runner.run(3)  # torch.compile's compile + warm-up
    on_gpu = args.device == "gpu"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        seconds, _ = runner.run(args.steps)
    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)
        prof.export_chrome_trace(os.path.join(args.trace_dir, f"{args.impl}.trace.json"))
    total, rows = torch_rows(prof.key_averages(), args.steps, on_gpu)
    what = "kernel" if on_gpu else "operator self"
    print(f"{args.config} {args.impl}: {seconds / args.steps * 1e3:.1f} ms per step (traced; "
          f"batch from {source}), {total:.1f} ms of {what} time per step")  # fmt: skip
    print(f"{'ms/step':>9}  {'n/step':>6}  {'kernel' if on_gpu else 'operator'}")
    for name, ms, n in rows[: args.top]:
        print(f"{ms:9.2f}  {n:6d}  {name}")


def op_span_ms(trace_file: str, steps: int) -> float:
    """From the first op's start to the last op's end, per step: on a GPU (one op at a time per
    stream) the leaf op time plus whatever the device waited for (the host, a transfer), so a
    span far above the op time is a step the device idles in. On the CPU ops of a step overlap
    across threads and the op time can exceed the span."""
    ops = op_events(trace_file)
    if not ops:
        return 0.0
    start, end = min(e["ts"] for e in ops), max(e["ts"] + e["dur"] for e in ops)
    return (end - start) / steps / 1e3


def _print_summary(trace: str, steps: int, top: int, head: str) -> None:
    leaf_ms, rows = summarise(trace, steps)
    print(f"{head}, {leaf_ms:.1f} ms of leaf op time per step; trace: {trace}")
    print(f"  first op to last: {op_span_ms(trace, steps):.1f} ms per step (idle gaps included)")
    inner_ms = sum(ms for _, ms, _, inner in rows if inner)
    print(f"  of which inside cond/while/call: {inner_ms:.1f} ms")
    print(f"{'ms/step':>9}  {'n/step':>6}  op")
    for name, ms, n, inner in rows[:top]:
        print(f"{ms:9.2f}  {n:6d}  {name}{'  (in cond/while)' if inner else ''}")


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        main()
