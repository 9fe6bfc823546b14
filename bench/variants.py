"""JAX-only A/B of step variants in ONE process, interleaved: compile time and step time.

    python -m bench.variants trm_sudoku_tiny --variant scan=true --variant remat=true \
        --variant scan=true,remat=true [--steps 10] [--threads N] [--data-path DIR]

Each variant is the trainer's real step (train.families.make_task + jit_train_step) built from the
same resolved config with some fields changed (TRMConfig `scan`, `remat`, ...; `optim.NAME` for an
optimiser field), stepping on the same batch (bench.runners.make_batch). The first
call of each is timed (trace + compile + one step, and `lower`/`compile` separately); then the
variants run one step each in turn, `--steps` times, and the median and IQR of each are printed,
with its ratio to the baseline taken step by step. Used for the findings in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _parse(item: str) -> dict:
    from bench.harness import parse_value

    out = {}
    for kv in item.split(","):
        k, v = kv.split("=", 1)
        out[k] = parse_value(v)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.variants")
    p.add_argument("config")
    p.add_argument("--variant", action="append", default=[], help="k=v[,k=v] model overrides")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help="override the global batch (real model sizes on CPU)",
    )
    p.add_argument("--out", default=None, help="write the result JSON here")
    p.add_argument(
        "--data-path", default=None, metavar="DIR", help="the data set the batch comes from"
    )
    args = p.parse_args(argv)

    from bench.worker import prepare_env

    prepare_env("jax", "cpu", args.threads)
    import jax
    from omegaconf import OmegaConf

    from bench import configs, runners
    from bench.stats import paired_ratios, summarize
    from train import mesh as mesh_lib
    from train.families import make_task
    from train.jit import build_train_step

    cfg = configs.get(args.config)
    if args.batch:
        import dataclasses

        cfg = dataclasses.replace(
            cfg, overrides=(*cfg.overrides, f"trainer.global_batch_size={args.batch}")
        )
    variants = [{}] + [_parse(v) for v in args.variant]
    built = []
    for ov in variants:
        rc = configs.resolve(cfg, jax_overrides=ov, data_path=args.data_path)
        tcfg = OmegaConf.create(rc["trainer_cfg"])
        mesh = mesh_lib.make_mesh(tcfg.mesh)
        task = make_task(tcfg, mesh, need_data=False)
        jitted, abstract = build_train_step(tcfg, mesh, task=task)
        t0 = time.perf_counter()
        lowered = jitted.lower(*abstract)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        state = task.create_state()
        batch = runners.place_batch(task, runners.make_batch(rc, 0)[0])
        state, m = compiled(state, batch)
        jax.block_until_ready(m)
        mem = compiled.memory_analysis()
        temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
        built.append(
            {
                "overrides": ov,
                "lower_s": t1 - t0,
                "compile_s": t2 - t1,
                "temp_bytes": temp,
                "hlo_chars": len(lowered.as_text()),
                "fn": compiled,
                "state": state,
                "batch": batch,
                "times": [],
            }
        )
    for _ in range(args.steps):
        for v in built:
            t0 = time.perf_counter()
            v["state"], m = v["fn"](v["state"], v["batch"])
            jax.block_until_ready(m)
            v["times"].append(time.perf_counter() - t0)
    base = built[0]["times"]
    rows = []
    for v in built:
        s = summarize(v["times"])
        r = paired_ratios(v["times"], base)
        rows.append(
            {k: v[k] for k in ("overrides", "lower_s", "compile_s", "temp_bytes", "hlo_chars")}
            | {"step_time_s": s, "ratio_to_baseline": r}
        )
        print(
            f"{json.dumps(v['overrides']) or '{}':<36} lower {v['lower_s']:6.2f} s  compile "
            f"{v['compile_s']:6.2f} s  step {s['median'] * 1e3:8.2f} ms "
            f"[{s['q1'] * 1e3:.2f}-{s['q3'] * 1e3:.2f}]  x{r['median']:.3f} of baseline  "
            f"temp {(v['temp_bytes'] or 0) / 2**20:.1f} MiB  HLO {v['hlo_chars'] / 1e3:.0f}k chars"
        )
    result = {
        "config": args.config,
        "threads": args.threads,
        "loadavg": os.getloadavg(),
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
