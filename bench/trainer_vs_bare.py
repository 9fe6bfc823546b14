"""The trainer's loop against its bare jitted step, same batches: `python -m bench trainer`.

    python -m bench trainer +experiment=trm_sudoku data.path=DIR [OVERRIDE ...] [--steps 20]
                            [--warmup 3] [--out FILE]

In one process (the same XLA flags, allocator and devices): the bare step (train.jit
.jit_train_step on the task of train.families.make_task) over the batches the trainer's own
iterator draws, placed on the devices first, one sync at the end; then `train.trainer.train` on
the same config for warmup + steps steps, its logged step_time_ms (compile excluded) after the
warm-up; then the bare step again, the mean of both bare runs reported. The persistent
compilation cache hands the second its executable. Prints `TRAINER_VS_BARE {json}`:
`trainer_over_bare`, and the experiment's scheduled steps at the trainer's pace (`projected_h`).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from train.errors import ConfigError, OneLineParser


def _bare(task, batches, step_fn) -> float:
    """Seconds per step of the jitted step over pre-placed batches, one sync at the end."""
    import jax

    state = task.create_state()
    warm, timed = batches
    for batch in warm:
        state, metrics = step_fn(state, batch)
    jax.block_until_ready((state, metrics))
    t0 = time.perf_counter()
    for batch in timed:
        state, metrics = step_fn(state, batch)
    jax.block_until_ready((state, metrics))
    return (time.perf_counter() - t0) / len(timed)


def _trainer_windows(run_dir: Path, warmup: int) -> list[dict]:
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "step_time_ms" in row and row["step"] > warmup:
            rows.append({"step": row["step"], "step_time_ms": row["step_time_ms"]})
    return rows


def measure(overrides: list[str], *, steps: int, warmup: int, work: Path) -> dict:
    import jax

    from train import families, xla_flags
    from train.compilation_cache import setup_compilation_cache
    from train.compose import load_config
    from train.jit import jit_train_step
    from train.main import one_run
    from train.mesh import make_mesh
    from train.trainer import train

    window = max(1, steps // 4)
    cfg = load_config([
        *overrides,
        "logging.wandb=disabled",
        "trainer.progress_bar=false",
        "checkpoint.enabled=false",
        f"run.out_dir={work}",
        "run.name=trainer",
        f"trainer.max_steps={warmup + steps}",
        f"trainer.log_interval={window}",
        f"run.compilation_cache_dir={work / 'xla-cache'}",
        "run.compilation_cache_min_compile_secs=0",
    ])  # fmt: skip
    xla_flags.apply(cfg.run.xla_flags)  # what train.main does first, before any backend starts
    # what train.main.one_run does next: the cache (make_task: x64 for the float64 loss)
    setup_compilation_cache(cfg.run.compilation_cache_dir, 0)
    mesh = make_mesh(cfg.mesh)
    task = families.make_task(cfg, mesh)
    data_iter = task.train_iterator()
    local = [next(data_iter) for _ in range(warmup + steps)]
    placed = [task.to_global(b) for b in local]
    batches = (placed[:warmup], placed[warmup:])
    step_fn = jit_train_step(task)
    t0 = time.perf_counter()
    bare = [_bare(task, batches, step_fn)]
    first_bare_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with one_run(cfg):
        train(cfg, mesh)
    trainer_wall_s = time.perf_counter() - t0
    bare.append(_bare(task, batches, step_fn))
    windows = _trainer_windows(work / "trainer", warmup)
    if not windows:
        raise ConfigError("bench trainer: the trainer logged no step time after the warm-up")
    trainer_s = statistics.median(w["step_time_ms"] for w in windows) / 1e3
    bare_s = statistics.fmean(bare)
    tokens = local[0].get("inputs", local[0].get("x"))
    return {
        # the experiment's own schedule (the task computes it from the config) at the trainer's pace
        "schedule_steps": task.total_steps,
        "projected_h": task.total_steps * trainer_s / 3600,
        "overrides": overrides,
        "device": str(jax.devices()[0].device_kind),
        "num_devices": jax.device_count(),
        "steps": steps,
        "warmup": warmup,
        "batch_source": f"the trainer's data iterator on {cfg.data.get('path')}",
        "first_batch_token_counts": {
            int(k): int(v) for k, v in zip(*np.unique(tokens, return_counts=True))
        },
        "bare_s_per_step": bare_s,
        "bare_runs_s_per_step": bare,
        "first_bare_with_compile_s": first_bare_s,
        "trainer_s_per_step": trainer_s,
        "trainer_windows": windows,
        "trainer_wall_s": trainer_wall_s,
        "trainer_over_bare": trainer_s / bare_s,
    }


def main(argv: list[str] | None = None) -> dict:
    p = OneLineParser(prog="python -m bench trainer", description=__doc__.split("\n")[0])
    p.add_argument("overrides", nargs="+", help="Hydra overrides, as for python -m train.main")
    p.add_argument("--steps", type=int, default=20, help="timed steps (each side)")
    p.add_argument("--warmup", type=int, default=3, help="steps before the timed ones")
    p.add_argument("--out", default=None, help="also write the result JSON here")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if a.steps < 1 or a.warmup < 1:
        p.error("--steps and --warmup must be >= 1")
    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as tmp:
        result = measure(a.overrides, steps=a.steps, warmup=a.warmup, work=Path(tmp))
    line = json.dumps(result, default=str)
    print(f"trainer {result['trainer_s_per_step'] * 1e3:.1f} ms/step, bare "
          f"{result['bare_s_per_step'] * 1e3:.1f} ms/step: trainer_over_bare "
          f"{result['trainer_over_bare']:.3f}; {result['schedule_steps']} steps "
          f"~ {result['projected_h']:.1f} h", flush=True)  # fmt: skip
    print("TRAINER_VS_BARE " + line, flush=True)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1, default=str))
    return result
