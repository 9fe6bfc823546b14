"""The first steps of a TRM run, ours and upstream's, from the same weights on the same batches.

    python -m bench.early_curve +experiment=trm_sudoku data.path=DIR --trm-src TRM \
        --adam-atan2-src ADAM [--steps 50] [--device cpu|cuda] [--out FILE.json] [KEY=VALUE ...]

A sanity check at full size, not a proof: tests/test_goldens_trm_train.py proves the training
step against upstream's own loop at a small size in float32 (within upstream's one-ulp
envelope); this runs the experiment as it is configured (trm_sudoku: batch 768, hidden 512, the
bf16 forward) where the GPU runs it, and puts the two losses side by side.

Upstream: pretrain.py's `init_train_state` seeded as `launch` seeds it, then `train_batch` on its
own PuzzleDataset loader (and the EMA update, when on), for --steps steps, on our data set at
data.path, its Hydra config mapped key for key from ours (`bench.curves.upstream_trm_overrides`);
loaded through parity.goldens.trm_pretrain (AdamATan2 through its authors' pure-PyTorch
reference; with --device cuda nothing else is rewritten; wandb, where it is not installed, is
`bench.upstream_runs.wandb_stand_in`: this loop never logs). Recorded per step: the batch, the
exploration draws it took from torch's global RNG, its metrics. Its initial state_dict is saved.

Ours, in the same process after upstream's memory is released: the TRM Task as `train.main`
builds it (`train.families.make_task`, one device), upstream's initial weights imported
(`Task.import_weights`), `Task.train_step` jitted over upstream's batches with upstream's draws
(parity.trm_draws).

Printed: one row per step (lr, each side's lm_loss, q_halt_loss, accuracy, exact_accuracy, mean
ACT steps, the loss's relative difference) and one `EARLY_CURVE {json}` line with every row and
the summary (the largest and the last relative difference of lm_loss, the steps whose halting
counts differ).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from train.errors import user_errors

METRICS = ("lm_loss", "q_halt_loss", "accuracy", "exact_accuracy", "steps")


def _np(v):
    if hasattr(v, "detach"):
        return (
            v.detach().float().cpu().numpy().copy()
            if v.is_floating_point()
            else (v.detach().cpu().numpy().copy())
        )
    return np.asarray(v)


def upstream_steps(cfg: dict, trm_src: Path, adam_src: Path, device: str, steps: int, work: Path):
    """Upstream's first `steps` training steps; -> (init state_dict file, [step records])."""
    import importlib.util

    import torch
    from hydra import compose, initialize_config_dir

    from bench.curves import upstream_trm_overrides
    from bench.upstream_runs import wandb_stand_in

    if importlib.util.find_spec("wandb") is None:  # a GPU image without it: pretrain.py imports it
        sys.modules["wandb"] = wandb_stand_in()
    from parity.goldens.trm import recorded_draws
    from parity.goldens.trm_pretrain import pretrain

    overrides = [
        f"data_paths=[{cfg['data']['path']}]",
        f"seed={cfg['run']['seed']}",
        f"+checkpoint_path={work / 'checkpoints'}",
        "+project_name=early-curve",
        "+run_name=upstream",
        *upstream_trm_overrides(cfg),
    ]
    records = []
    # pretrain.py prints the model and its settings: kept out of this command's output
    with (
        pretrain(trm_src, adam_src, device=device) as (pt, imp),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        with initialize_config_dir(config_dir=str(Path(trm_src).resolve() / "config"),
                                   version_base=None):  # fmt: skip
            hydra_cfg = compose("cfg_pretrain", overrides=overrides)
        config = pt.load_synced_config(hydra_cfg, rank=0, world_size=1)
        torch.random.manual_seed(config.seed)  # as launch
        # launch's create_dataloader, iterated in this process (num_workers=0)
        dataset = pt.PuzzleDataset(
            pt.PuzzleDatasetConfig(
                seed=config.seed, dataset_paths=config.data_paths, rank=0, num_replicas=1,
                test_set_mode=False, epochs_per_iter=config.eval_interval or config.epochs,
                global_batch_size=config.global_batch_size,
            ),
            split="train",
        )  # fmt: skip
        train_loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0)
        ts = pt.init_train_state(config, dataset.metadata, rank=0, world_size=1)
        init_file = work / "upstream_init.pt"
        torch.save({k: v.detach().cpu().clone() for k, v in ts.model.state_dict().items()},
                   init_file)  # fmt: skip
        ema = None
        if config.ema:
            ema = imp("models.ema").EMAHelper(mu=config.ema_rate)
            ema.register(ts.model)
        ts.model.train()
        for _set_name, batch, global_batch_size in train_loader:
            draws: list = []
            t0 = time.perf_counter()
            with recorded_draws(draws):
                metrics = pt.train_batch(config, ts, batch, global_batch_size, rank=0, world_size=1)
            if ema is not None:
                ema.update(ts.model)
            if device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            records.append({
                "batch": {k: _np(v) for k, v in batch.items()},
                "draws": {name: _np(x) for name, x in draws},
                "metrics": {k.removeprefix("train/"): float(v) for k, v in metrics.items()},
                "halted": int(_np(ts.carry.halted).sum()),
                "seconds": seconds,
            })  # fmt: skip
            if len(records) == steps:
                break
        del ts, ema, train_loader, dataset
    if device == "cuda":
        torch.cuda.empty_cache()
    return init_file, records


def our_steps(cfg, init_file: Path, records: list[dict]) -> list[dict]:
    """Task.train_step over upstream's batches and draws, from upstream's initial weights."""
    import jax
    import jax.numpy as jnp
    from omegaconf import OmegaConf

    from parity.trm_draws import state_with_draws, train_state_with_draws
    from train.families import make_task
    from train.mesh import make_mesh

    cfg = OmegaConf.create(cfg)
    task = make_task(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    state = task.import_weights(task.create_state(), str(init_file))
    task.graphdef, train = train_state_with_draws(task.graphdef, state["train"])
    state = {**state, "train": train}
    step_fn = jax.jit(task.train_step)
    out = []
    for rec in records:
        batch = {k: jnp.asarray(v) for k, v in rec["batch"].items()}
        state = {**state, "train": state_with_draws(task.graphdef, state["train"],
                                                    (rec["draws"]["u"], rec["draws"]["k"]))}  # fmt: skip
        t0 = time.perf_counter()
        state, metrics = step_fn(state, batch)
        metrics = jax.device_get(metrics)
        out.append({
            "metrics": {k: float(v) for k, v in metrics.items()},
            "halted": int(np.asarray(state["carry"].halted).sum()),
            "seconds": time.perf_counter() - t0,
        })  # fmt: skip
    return out


def side_by_side(up: list[dict], ours: list[dict]) -> dict:
    rows = []
    for i, (u, o) in enumerate(zip(up, ours, strict=True)):
        row = {"step": i + 1, "lr": u["metrics"].get("lr"), "halted": [u["halted"], o["halted"]]}
        for k in METRICS:
            row[k] = [u["metrics"].get(k), o["metrics"].get(k)]
        a, b = row["lm_loss"]
        row["lm_loss_rel_diff"] = abs(b - a) / abs(a) if a else None
        rows.append(row)
    rel = [r["lm_loss_rel_diff"] for r in rows if r["lm_loss_rel_diff"] is not None]
    return {
        "rows": rows,
        "lm_loss_rel_diff_max": max(rel, default=None),
        "lm_loss_rel_diff_last": rel[-1] if rel else None,
        "halting_differs_at": [r["step"] for r in rows if r["halted"][0] != r["halted"][1]],
        "upstream_s_per_step": float(np.median([u["seconds"] for u in up[1:] or up])),
        "ours_s_per_step": float(np.median([o["seconds"] for o in ours[1:] or ours])),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m bench.early_curve", description=__doc__.split("\n")[0]
    )
    p.add_argument("overrides", nargs="+", help="+experiment=NAME data.path=DIR [KEY=VALUE ...]")
    p.add_argument("--trm-src", required=True, type=Path)
    p.add_argument("--adam-atan2-src", required=True, type=Path)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cuda" if a.device == "cuda" else "cpu")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch runs first, beside it
    from omegaconf import OmegaConf

    from train import xla_flags
    from train.compose import load_config

    quiet = ["logging.wandb=disabled", "trainer.progress_bar=false", "mesh=cpu"]
    cfg = OmegaConf.to_container(load_config([*a.overrides, *quiet]), resolve=True)
    if cfg.get("family") != "trm":
        raise SystemExit(f"bench.early_curve: a TRM experiment, not family={cfg.get('family')}")
    xla_flags.apply(cfg["run"].get("xla_flags"))  # ours as the trainer runs (JAX starts later)
    if not cfg["data"].get("path"):
        raise SystemExit("bench.early_curve: data.path=DIR (a built TRM data set) is required")
    with tempfile.TemporaryDirectory(prefix="early_curve_") as tmp:
        init_file, up = upstream_steps(cfg, a.trm_src, a.adam_atan2_src, a.device, a.steps,
                                       Path(tmp))  # fmt: skip
        ours = our_steps(cfg, init_file, up)
    result = {"experiment": [o for o in a.overrides if o.startswith("+experiment=")],
              "device": a.device, "steps": len(up), **side_by_side(up, ours)}  # fmt: skip
    print(f"{'step':>4} {'lr':>9} {'lm_loss up':>11} {'ours':>9} {'rel diff':>9} "
          f"{'exact up':>8} {'ours':>6} {'halted up':>9} {'ours':>5}")  # fmt: skip
    for r in result["rows"]:
        print(f"{r['step']:4d} {r['lr'] or 0:9.2e} {r['lm_loss'][0]:11.5f} {r['lm_loss'][1]:9.5f} "
              f"{r['lm_loss_rel_diff'] or 0:9.2e} {r['exact_accuracy'][0]:8.4f} "
              f"{r['exact_accuracy'][1]:6.4f} {r['halted'][0]:9d} {r['halted'][1]:5d}")  # fmt: skip
    print("EARLY_CURVE " + json.dumps(result), flush=True)
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        main(sys.argv[1:])
