"""Where a train step spends its time: a profiler trace, summarised per op.

    python -m bench.profile --trace RUN_DIR/profile --steps 3    # a trainer run's own steps
    python -m bench.profile trm_sudoku_tiny [--impl jax|torch_eager|torch_compile] [--threads 1]
        [--steps 3] [--top 25] [--trace-dir DIR] [--hlo FILE[.gz]] [--jax-model K=V ...]
        [--data-path DIR] [--device cpu|gpu]

Runs the trainer's real step (the same `bench.runners.JaxRunner` the benchmark times), warms it
up, traces `--steps` steps with `jax.profiler`, and prints the op time per step grouped by XLA
op name (numeric and `.clone` suffixes dropped: `ynn_fusion.12` -> `ynn_fusion`). Control-flow
thunks (`cond`, `while`, `call`) are containers: their events span their branch's ops, so they
are left out of the sum and each leaf op is marked `in cond/while` when it ran inside one
(docs/benchmarks.md, "jax.profiler's CPU events nest"). `--hlo FILE` writes the optimised HLO of
the step (gzipped when FILE ends in .gz), to look up what a fusion computes. On a GPU, XLA's
command buffers are off for the trace (docs/benchmarks.md, "A GPU trace shows command_buffer").

`--impl torch_eager` / `torch_compile` profiles the PyTorch reference's step instead (the same
`bench.runners` torch runner, on the same batch) with torch.profiler and prints the same table per
kernel: on a GPU the CUDA kernels' own time (torch.compile's fused Triton kernels by name), on the
CPU the operators' self time.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile

from train.errors import ConfigError, OneLineParser, user_errors

_CONTAINERS = ("cond", "while", "call")
NO_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer="


def _op_name(hlo_op: str) -> str:
    """`ynn_fusion.12` -> `ynn_fusion`, `cond.1.clone` -> `cond`."""
    return re.sub(r"(\.\d+|\.clone)+$", "", hlo_op)


def op_events(trace_file: str) -> list[dict]:
    """The trace's XLA op events: complete events carrying an `hlo_op` argument (runtime
    bookkeeping such as `DevicePut` or the thread pool's events has none)."""
    with gzip.open(trace_file) as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and "hlo_op" in (e.get("args") or {})]


def summarise(trace_file: str, steps: int) -> tuple[float, list[tuple[str, float, int, bool]]]:
    """(leaf op ms per step, [(op, ms per step, count per step, inside a container)])."""
    events = op_events(trace_file)
    names = [_op_name(e["args"]["hlo_op"]) for e in events]
    spans = collections.defaultdict(list)  # thread -> [(start, end)] of container thunks
    for e, name in zip(events, names):
        if name in _CONTAINERS:
            spans[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    total, count = collections.Counter(), collections.Counter()
    for e, name in zip(events, names):
        if name not in _CONTAINERS:
            start, end = e["ts"], e["ts"] + e["dur"]
            inner = any(s <= start and end <= t for s, t in spans[e["tid"]])
            total[(name, inner)] += e["dur"]
            count[(name, inner)] += 1
    rows = [(name, us / steps / 1e3, -(-count[(name, inner)] // steps), inner)
            for (name, inner), us in total.most_common()]  # fmt: skip
    return sum(total.values()) / steps / 1e3, rows


def op_span_ms(trace_file: str, steps: int) -> float:
    """From the first op's start to the last op's end, per step: on a GPU the leaf op time plus
    whatever the device waited for (the host, a transfer). On the CPU ops of a step overlap
    across threads and the op time can exceed the span."""
    ops = op_events(trace_file)
    if not ops:
        return 0.0
    return (max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops)) / steps / 1e3


def _print_summary(trace: str, steps: int, top: int, head: str) -> None:
    leaf_ms, rows = summarise(trace, steps)
    print(f"{head}, {leaf_ms:.1f} ms of leaf op time per step; trace: {trace}")
    print(f"  first op to last: {op_span_ms(trace, steps):.1f} ms per step (idle gaps included)")
    print(f"  of which inside cond/while/call: {sum(r[1] for r in rows if r[3]):.1f} ms")
    print(f"{'ms/step':>9}  {'n/step':>6}  op")
    for name, ms, n, inner in rows[:top]:
        print(f"{ms:9.2f}  {n:6d}  {name}{'  (in cond/while)' if inner else ''}")


def main(argv=None):
    p = OneLineParser(prog="python -m bench.profile")
    p.add_argument("config", nargs="?", help="a bench config name (bench/configs.py)")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="summarise the newest trace under DIR instead of running (a trainer "
                   "run's <run dir>/profile; --steps = the steps it holds)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, help="pin to this many cores")
    p.add_argument("--steps", type=int, default=3, help="traced steps")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--trace-dir", default=None, help="keep the trace here (TensorBoard/Perfetto)")
    p.add_argument("--hlo", default=None, help="write the step's optimised HLO to this file")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--impl", default="jax", choices=("jax", "torch_eager", "torch_compile"))
    p.add_argument("--jax-model", action="append", default=[], metavar="KEY=VALUE",
                   help="a JAX-side override for this run (scan=true, attention_impl=explicit)")  # fmt: skip
    p.add_argument("--data-path", default=None, metavar="DIR",
                   help="the data set the batch comes from (bench.runners.make_batch)")  # fmt: skip
    args = p.parse_args(argv)
    if args.trace:
        found = sorted(glob.glob(f"{args.trace}/**/*.trace.json.gz", recursive=True))
        if not found:
            raise ConfigError(f"bench.profile: no *.trace.json.gz under {args.trace}")
        return _print_summary(found[-1], args.steps, args.top, "trace")
    if not args.config:
        p.error("a config name, or --trace DIR")
    if args.impl != "jax" and (args.hlo or args.jax_model):
        p.error("--hlo and --jax-model are for --impl jax")

    from bench import configs, runners
    from bench.worker import apply_config_xla_flags, prepare_env

    prepare_env(args.impl, args.device, args.threads)  # before jax or torch loads
    cfg = configs.get(args.config)
    rc = configs.resolve(cfg, jax_overrides=args.jax_model, data_path=args.data_path)
    spec = {"impl": args.impl, "device": args.device, "seed": 0, "resolved": rc}
    if args.impl != "jax":
        return _profile_torch(args, spec)
    if args.device == "gpu":
        os.environ["XLA_FLAGS"] = f"{os.environ['XLA_FLAGS']} {NO_COMMAND_BUFFERS}".strip()
    print(f"XLA_FLAGS: {apply_config_xla_flags(rc)!r}")  # the trainer's, before the backend starts
    import jax

    runner = runners.JaxRunner(rc, spec)
    runner.setup()
    runner.run(3)  # compile + warm-up
    if args.hlo:
        text = runner.step_fn.lower(runner.state, runner.batch).compile().as_text()
        os.makedirs(os.path.dirname(os.path.abspath(args.hlo)), exist_ok=True)
        with (gzip.open if args.hlo.endswith(".gz") else open)(args.hlo, "wt") as f:
            f.write(text)
        print(f"wrote the optimised HLO to {args.hlo}", flush=True)
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="bench_profile_")
    jax.profiler.start_trace(trace_dir)
    seconds, _ = runner.run(args.steps)
    jax.profiler.stop_trace()
    trace = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))[-1]
    _print_summary(trace, args.steps, args.top, f"{args.config}: {seconds / args.steps * 1e3:.1f} "
                   f"ms per step (traced; batch from {runner.batch_source})")  # fmt: skip


def torch_rows(averages, steps: int, on_gpu: bool) -> tuple[float, list[tuple[str, float, int]]]:
    """torch.profiler's `key_averages()` -> (ms per step, [(name, ms per step, count per step)]):
    on a GPU the device's kernels (their own time; the CPU operators that launched them would
    count every kernel twice), on the CPU the operators' self time."""
    from torch.autograd import DeviceType

    rows = []
    for e in averages:
        if on_gpu and e.device_type != DeviceType.CUDA:
            continue
        us = e.self_device_time_total if on_gpu else e.self_cpu_time_total
        if us > 0:
            rows.append((e.key, us / steps / 1e3, -(-e.count // steps)))
    rows.sort(key=lambda r: -r[1])
    return sum(r[1] for r in rows), rows


def _profile_torch(args, spec: dict) -> None:
    from torch.profiler import ProfilerActivity, profile

    from bench import runners

    runner = runners.make_runner(spec)
    source = runner.setup()["batch_source"]
    runner.run(3)  # torch.compile's compile + warm-up
    on_gpu = args.device == "gpu"
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * on_gpu) as prof:
        seconds, _ = runner.run(args.steps)
    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)
        prof.export_chrome_trace(os.path.join(args.trace_dir, f"{args.impl}.trace.json"))
    total, rows = torch_rows(prof.key_averages(), args.steps, on_gpu)
    print(f"{args.config} {args.impl}: {seconds / args.steps * 1e3:.1f} ms per step (traced; "
          f"batch from {source}), {total:.1f} ms of {'kernel' if on_gpu else 'operator self'} "
          "time per step")  # fmt: skip
    print(f"{'ms/step':>9}  {'n/step':>6}  {'kernel' if on_gpu else 'operator'}")
    for name, ms, n in rows[: args.top]:
        print(f"{ms:9.2f}  {n:6d}  {name}")


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        main()
