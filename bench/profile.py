"""Where the JAX train step spends its time: a jax.profiler trace, summarised per XLA op.

    python -m bench.profile trm_sudoku_tiny [--threads 1] [--steps 3] [--top 25] \
        [--trace-dir DIR] [--hlo FILE]

Runs the trainer's real step (the same `bench.runners.JaxRunner` the benchmark times), warms it
up, traces `--steps` steps with `jax.profiler`, and prints the op time per step grouped by XLA
op name (numeric and `.clone` suffixes dropped: `ynn_fusion.12` -> `ynn_fusion`). Control-flow thunks
(`cond`, `while`, `call`) are containers: their events span their branch's ops, so they are
left out of the sum and each leaf op is marked `in cond/while` when it ran inside one (summing
all events double counts; docs/benchmarks.md, "Traps"). `--hlo FILE` writes the optimised HLO
of the step, to look up what a fusion computes. Used for the findings in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile

_CONTAINERS = ("cond", "while", "call")


def _op_name(hlo_op: str) -> str:
    """`ynn_fusion.12` -> `ynn_fusion`, `cond.1.clone` -> `cond`."""
    return re.sub(r"(\.\d+|\.clone)+$", "", hlo_op)


def summarise(trace_file: str, steps: int) -> tuple[float, list[tuple[str, float, int, bool]]]:
    """(leaf op ms per step, [(op, ms per step, count per step, inside a container)]).

    Op events are the ones carrying an `hlo_op` argument (runtime bookkeeping such as
    `DevicePut` or the thread pool's events has none)."""
    with gzip.open(trace_file) as f:
        events = [
            e
            for e in json.load(f)["traceEvents"]
            if e.get("ph") == "X" and "hlo_op" in (e.get("args") or {})
        ]
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
    p.add_argument("config", help="a bench config name (bench/configs.py)")
    p.add_argument("--threads", type=int, default=None, help="pin to this many cores")
    p.add_argument("--steps", type=int, default=3, help="traced steps")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--trace-dir", default=None, help="keep the trace here (TensorBoard/Perfetto)")
    p.add_argument("--hlo", default=None, help="write the step's optimised HLO to this file")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    args = p.parse_args(argv)

    from bench.worker import prepare_env

    prepare_env("jax", args.device, args.threads)
    import jax

    from bench import configs, runners

    rc = configs.resolve(configs.get(args.config))
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
    leaf_ms, rows = summarise(trace, args.steps)
    print(
        f"{args.config}: {seconds / args.steps * 1e3:.1f} ms per step (traced), "
        f"{leaf_ms:.1f} ms of leaf op time; trace: {trace}"
    )
    inner_ms = sum(ms for _, ms, _, inner in rows if inner)
    print(f"  of which inside cond/while/call: {inner_ms:.1f} ms")
    print(f"{'ms/step':>9}  {'n/step':>6}  op")
    for name, ms, n, inner in rows[: args.top]:
        print(f"{ms:9.2f}  {n:6d}  {name}{'  (in cond/while)' if inner else ''}")


if __name__ == "__main__":
    main()
