"""One config of the step-time benchmark: its implementations interleaved round by round.

Each implementation lives in its own worker process (bench/worker.py) holding the model, the
optimiser state and ONE fixed batch on the device. The parent drives them in rounds: in every
round each worker runs K steps ending in a device sync while the others wait, in the same order
(A B C A B C ...). Round 0 is the first call (trace + compile + one step); `warmup` more rounds
are thrown away; the next `steps` rounds are timed. Ratios are taken round by round
(t_jax[r] / t_torch[r]) before the median, so drift of the machine between rounds cancels.
"""

from __future__ import annotations

from bench import configs as bench_configs
from bench.stats import paired_ratios, summarize
from bench.worker import Worker, WorkerError, record_error


def flops_per_step(rc: dict) -> int:
    """Analytic FLOPs of one train step of a resolved config (models/<family>/flops.py)."""
    if rc["family"] == "gpt":
        from models.gpt import GPTConfig
        from models.gpt.flops import gpt_flops_per_step

        return gpt_flops_per_step(GPTConfig(**rc["model"]), rc["batch_size"])
    from models.trm import TRMConfig
    from models.trm.flops import trm_flops_per_step

    return trm_flops_per_step(
        TRMConfig(**{**rc["model"], "batch_size": rc["batch_size"]}), rc["batch_size"]
    )


def bench_config(
    cfg: bench_configs.BenchConfig,
    impls: list[str],
    *,
    device: str,
    steps: int,
    warmup: int,
    inner: int,
    seed: int,
    peak_flops: float | None,
    timeout_s: float,
    jax_overrides: dict,
    threads: int | None = None,
    tokens: str = "data",
    data_path: str | None = None,
    log=print,
) -> dict:
    """Run one config's implementations interleaved; return its JSON record. Every
    implementation steps on the same batch (bench.runners.make_batch: `tokens`, `data_path`)."""
    rc = bench_configs.resolve(cfg, seed=seed, jax_overrides=jax_overrides, data_path=data_path)
    try:
        flops = flops_per_step(rc)
    except ValueError:  # a model config its own class refuses: each side reports the error
        flops = None
    record = {
        "config": cfg.name,
        "family": rc["family"],
        "config_source": rc["source"],
        "batch_size": rc["batch_size"],
        "dtype": rc["dtype"],
        "model": rc["model"],
        "optim": rc["optim"],
        "unit": rc["unit"],
        "items_per_step": rc["items_per_step"],
        "flops_per_step": flops,
        "jax_overrides": jax_overrides,
        "tokens": tokens,
        "data_path": data_path,
        "threads": threads,
        "schedule": [],
        "impls": {},
        "ratios": {},
    }
    workers: dict[str, Worker] = {}
    for impl in impls:
        spec = {
            "impl": impl,
            "device": device,
            "config": cfg.name,
            "resolved": rc,
            "seed": seed,
            "threads": threads,
            "tokens": tokens,
        }
        res = {"status": "ok"}
        record["impls"][impl] = res
        log(f"[{cfg.name}] starting {impl} ...")
        try:
            w = Worker(spec, timeout_s)
            workers[impl] = w
            res["info"] = w.info
            log(f"[{cfg.name}] {impl}: batch from {w.info.get('batch_source')}")
        except WorkerError as e:
            log(f"[{cfg.name}] {impl} failed at setup: {record_error(res, e)}")

    times: dict[str, list[float]] = {name: [] for name in workers}
    losses: dict[str, list[float]] = {name: [] for name in workers}

    def one_round(n: int, timed: bool) -> None:
        for name in list(workers):
            record["schedule"].append(name)
            try:
                out = workers[name].call("run", n)
            except WorkerError as e:
                log(f"[{cfg.name}] {name} failed: {record_error(record['impls'][name], e)}")
                workers.pop(name).close()
                continue
            losses[name].append(out["loss"])
            if timed:
                times[name].append(out["seconds"] / n)
            elif "first_step_s" not in record["impls"][name]:
                record["impls"][name]["first_step_s"] = out["seconds"]

    one_round(1, timed=False)  # trace + compile + one step
    for _ in range(warmup):
        one_round(inner, timed=False)
    compiles_before = {}
    for name in list(workers):
        compiles_before[name] = workers[name].call("stats").get("compiles")
    for r in range(steps):
        one_round(inner, timed=True)
        if (r + 1) % max(1, steps // 4) == 0:
            log(f"[{cfg.name}] round {r + 1}/{steps}")

    for name, w in workers.items():
        res = record["impls"][name]
        stats = w.call("stats")
        w.close()
        t = summarize(times[name])
        res["step_time_s"] = t
        res["losses"] = losses[name]
        res["memory"] = stats
        if t:
            res["items_per_s"] = rc["items_per_step"] / t["median"]
            res["flops_per_s"] = flops / t["median"] if flops else None
            res["mfu"] = flops / t["median"] / peak_flops if flops and peak_flops else None
            res["compile_s"] = max(0.0, res["first_step_s"] - t["median"])
        before, after = compiles_before.get(name), stats.get("compiles")
        res["recompiles_during_timing"] = (
            after - before if before is not None and after is not None else None
        )
    if times.get("jax"):
        for other in ("torch_eager", "torch_compile"):
            if times.get(other):
                record["ratios"][f"jax/{other}"] = paired_ratios(times["jax"], times[other])
    if times.get("torch_compile") and times.get("torch_eager"):
        record["ratios"]["torch_compile/torch_eager"] = paired_ratios(
            times["torch_compile"], times["torch_eager"]
        )
    return record
