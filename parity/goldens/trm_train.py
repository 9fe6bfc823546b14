"""TRM training goldens: upstream pretrain.py's own training loop, run from a checkout on the CPU.

`generate(trm_src, adam_src, out)` builds a small Sudoku data set with our builder
(data.sudoku_easy, DATA), which upstream's PuzzleDataset reads, composes upstream's Hydra config
(config/cfg_pretrain.yaml + arch/trm.yaml with OVERRIDES) through pretrain.py's
`load_synced_config`, and runs, per variant (mlp_t, att), what pretrain.py's `launch` runs:

    torch seeded with config.seed; init_train_state (SignSGD on the puzzle table + AdamATan2);
    EMAHelper.register; per batch of the train loader: train_batch (carry, loss / global batch,
    both optimizers with the warm-up + cosine lr), EMAHelper.update;
    then the EMA copy, evaluate on the test split, save_train_state and save_code_and_config.

Only the loader differs from launch: the same PuzzleDataset iterated in this process (DataLoader
with num_workers=0; launch's create_dataloader uses one worker process), numpy's global RNG (which
PuzzleDataset's sampling draws from) seeded with SEED first. The loaded module is
parity.goldens.trm_pretrain's (device strings rewritten, DISABLE_COMPILE, adam-atan2's reference
implementation as its kernel).

The initial weights are upstream's init with the q head made non-trivial (weights
0.1 * N(0, 1), bias Q_BIAS; upstream starts at 0 and -5, so that no row would halt before
halt_max_steps in 50 steps): rows halt at different ACT steps, exploration delays some, and
halted slots are refilled from the next batch.

OUT/trm_train_<variant>.npz holds:
- `init.<key>`: the initial state_dict (what the port imports);
- per step i (from 0): `step.i.batch.*` (upstream's batch), `step.i.explore_u/k` (the exploration
  draws train_batch took from torch's global RNG), `step.i.lr`, `step.i.metrics.<name>` (what
  train_batch returned: train/<name>), the carry's integer state (`steps`, `halted`,
  `current_data.*`) and, every CARRY_EVERY steps and at the last, its z_H / z_L;
- `final.param.<name>`, `final.exp_avg.<name>`, `final.exp_avg_sq.<name>`,
  `final.adam_step.<name>`, `final.puzzle_emb`: after the last step (the EMA weights are the
  checkpoint's parameters, below);
- `eval.<set>.<metric>`: evaluate's output on the EMA model (as launch evaluates);
- `train.envelope` [steps], `final.envelope`, `eval.envelope`: the float32 one-ulp envelope.

The envelope: the whole run repeated with every initial weight moved by one float32 ulp (a random
direction per element, ENVELOPE_SEEDS), the same batches and draws; per step, the largest
scale-relative move of any float quantity (metrics, lr, the carry and every parameter at that step,
recorded or not); `final.envelope` over the final params / EMA / moments / table; `eval.envelope`:
evaluate on the saved EMA model moved by one float32 ulp. A perturbed run whose integer state
differs (a halting decision flipped) is an error: the run would sit on a tie.

OUT/trm_train_<variant>_checkpoint/{step_N, all_config.yaml}: what save_train_state and
save_code_and_config wrote (the EMA model's state_dict, keys without `_orig_mod.` since the model
is not compiled; the config as pretrain.py dumps it). The model source files that
save_code_and_config copies beside them are upstream's code: not kept.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from parity import machine
from parity.envelope import move
from parity.goldens.common import git_commit, save_npz, write_manifest
from parity.goldens.trm import perturb_f32_ulp, recorded_draws

SEED = 0
ENVELOPE_SEEDS = (1, 2)
EVAL_ENVELOPE_SEEDS = (3, 4)
DATA = dict(
    train=24, test=10, blanks=8, num_aug=1, unique=0
)  # data.sudoku_easy: 10 epochs x 6 batches
DATA_DIR = "data"  # relative to the working directory of the run (paths in all_config.yaml)
CHECKPOINT_DIR = "checkpoint"
CARRY_EVERY = 20
# The largest envelope accepted: above it round-off has grown chaotically and the bound would
# accept nearly anything (measured at lr=3e-3: O(1) within 20 steps; here about 1e-4).
MAX_ENVELOPE = 1e-3
Q_BIAS = (0.5, -0.5)
# upstream config/cfg_pretrain.yaml + arch/trm.yaml, overridden (Hydra syntax)
COMMON = [
    f"data_paths=[{DATA_DIR}]",
    "evaluators=[]",
    "global_batch_size=4",
    "epochs=10",
    "eval_interval=null",
    "lr=1e-4",
    "lr_min_ratio=0.1",
    "lr_warmup_steps=5",
    "weight_decay=0.1",
    "puzzle_emb_lr=1e-2",
    "puzzle_emb_weight_decay=0.1",
    "ema=true",
    "ema_rate=0.9",
    f"seed={SEED}",
    "+project_name=trm_train_goldens",
    f"+checkpoint_path={CHECKPOINT_DIR}",
    "arch.hidden_size=16",
    "arch.num_heads=2",
    "arch.expansion=2",
    "arch.H_cycles=2",
    "arch.L_cycles=2",
    "arch.halt_max_steps=4",
    "arch.halt_exploration_prob=0.5",
    "arch.puzzle_emb_len=1",
    "arch.forward_dtype=float32",
]
VARIANTS = {
    "mlp_t": ["arch.mlp_t=true", "arch.pos_encodings=none", "arch.L_layers=1", "+run_name=mlp_t"],
    "att": ["arch.mlp_t=false", "arch.pos_encodings=rope", "arch.L_layers=2", "+run_name=att"],
}
STAND_IN_REASONS = {
    "adam_atan2_backend": "adam-atan2's CUDA extension: replaced by the same package's pure-"
    "PyTorch reference (adam_atan2/adam_atan2_test.py _adam_atan2_reference_impl), per parameter",
    "device": 'pretrain.py\'s "cuda" / .cuda() read as "cpu" / .cpu() at load time; '
    "DISABLE_COMPILE=1 (pretrain.py's own switch: no torch.compile)",
    "loader": "PuzzleDataset iterated in this process (num_workers=0) instead of one worker "
    "process; numpy's global RNG seeded first (PuzzleDataset samples with np.random.choice)",
}


def build_data(root: Path) -> dict:
    """Our builder's Sudoku set in root/DATA_DIR; -> {relative file: sha256}."""
    from data.sudoku_easy import build_easy_sudoku

    build_easy_sudoku(str(root / DATA_DIR), seed=SEED, **DATA)
    return data_hashes(root / DATA_DIR)


def data_hashes(path: Path) -> dict:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(path).rglob("*"))
        if p.is_file()
    }


def compose(trm_src: Path, overrides: list[str]):
    """Upstream's Hydra config (config/cfg_pretrain.yaml), as @hydra.main would compose it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(Path(trm_src).resolve() / "config"), version_base=None):
        return hydra_compose("cfg_pretrain", overrides=overrides)


def _np(v):
    if hasattr(v, "detach"):
        return v.detach().cpu().numpy().copy()
    return np.asarray(v)


def _loaders(pt, config):
    """Upstream's train and test PuzzleDatasets as create_dataloader configures them."""
    from torch.utils.data import DataLoader

    def make(split, test_set_mode, epochs_per_iter):
        ds = pt.PuzzleDataset(
            pt.PuzzleDatasetConfig(
                seed=config.seed,
                dataset_paths=config.data_paths,
                rank=0,
                num_replicas=1,
                test_set_mode=test_set_mode,
                epochs_per_iter=epochs_per_iter,
                global_batch_size=config.global_batch_size,
            ),
            split=split,
        )
        return DataLoader(ds, batch_size=None, num_workers=0), ds.metadata

    epochs = config.eval_interval if config.eval_interval is not None else config.epochs
    return make("train", False, epochs), make("test", True, 1)


def initial_state_dict(pt, config) -> dict:
    """Upstream's init (torch seeded with config.seed, as launch), q head made non-trivial."""
    import torch

    torch.random.manual_seed(config.seed)
    (_, meta), _ = _loaders(pt, config)
    model = pt.init_train_state(config, meta, rank=0, world_size=1).model
    q = model.model.inner.q_head
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        q.weight.copy_(0.1 * torch.randn(q.weight.shape, generator=g))
        q.bias.copy_(torch.tensor(Q_BIAS))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_run(pt, imp, config, state_dict: dict, *, every_carry: bool):
    """launch's loop on `state_dict`: -> (steps [(exact, floats, inputs)], final floats, final
    exact, train_state, ema_helper, eval loader and metadata)."""
    import torch

    EMAHelper = imp("models.ema").EMAHelper
    np.random.seed(SEED)  # noqa: NPY002 - upstream samples from the global RNG (np.random.choice)
    torch.random.manual_seed(config.seed)
    (train_loader, train_meta), (eval_loader, eval_meta) = _loaders(pt, config)
    ts = pt.init_train_state(config, train_meta, rank=0, world_size=1)
    ts.model.load_state_dict(state_dict)
    ema = EMAHelper(mu=config.ema_rate)
    ema.register(ts.model)
    ts.model.train()
    params = dict(ts.model.named_parameters())
    steps = []
    for _set_name, batch, global_batch_size in train_loader:
        draws = []
        with recorded_draws(draws):
            metrics = pt.train_batch(config, ts, batch, global_batch_size, rank=0, world_size=1)
        if config.ema:
            ema.update(ts.model)
        if metrics is None:
            raise ValueError("train_batch skipped a step: the run is longer than total_steps")
        carry = ts.carry
        exact = {"steps": carry.steps, "halted": carry.halted}
        exact.update({f"current_data.{k}": v for k, v in carry.current_data.items()})
        inputs = {f"batch.{k}": v for k, v in batch.items()}
        inputs.update({f"explore_{name}": x for name, x in draws})
        floats = {f"metrics.{k.removeprefix('train/')}": np.float64(v) for k, v in metrics.items()}
        floats["lr"] = np.float64(metrics["train/lr"])
        if every_carry or len(steps) % CARRY_EVERY == 0:
            floats.update(z_H=carry.inner_carry.z_H, z_L=carry.inner_carry.z_L)
        if every_carry:  # envelope only: every parameter at every step
            floats.update({f"param.{n}": p for n, p in params.items()})
        steps.append(tuple({k: _np(v) for k, v in d.items()} for d in (exact, floats, inputs)))
    final, final_exact = final_state(ts, ema)
    return steps, final, final_exact, ts, ema, (eval_loader, eval_meta)


def final_state(ts, ema) -> tuple[dict, dict]:
    """Every parameter, EMA weight, AdamATan2 moment and the puzzle table; the moments' step."""
    named = dict(ts.model.named_parameters())
    floats = {f"param.{n}": p for n, p in named.items()}
    floats.update({f"ema.{n}": t for n, t in ema.shadow.items()})
    adam = ts.optimizers[-1]
    assert type(adam).__name__ == "AdamATan2", type(adam)
    exact = {}
    for n, p in named.items():
        st = adam.state[p]
        floats[f"exp_avg.{n}"], floats[f"exp_avg_sq.{n}"] = st["exp_avg"], st["exp_avg_sq"]
        exact[f"adam_step.{n}"] = st["step"]
    floats["puzzle_emb"] = ts.model.model.inner.puzzle_emb.weights
    return {k: _np(v) for k, v in floats.items()}, {k: _np(v) for k, v in exact.items()}


def ema_train_state(ts, ema):
    """launch's `train_state_eval`: a deep copy whose model is the EMA copy, in eval mode."""
    ts_eval = copy.deepcopy(ts)
    ts_eval.model = ema.ema_copy(ts_eval.model)
    ts_eval.model.eval()
    return ts_eval


def run_evaluate(pt, config, ts_eval, loader) -> dict:
    out = pt.evaluate(
        config, ts_eval, loader[0], loader[1], [], rank=0, world_size=1, cpu_group=None
    )
    return {f"{s}.{k}": np.float64(v) for s, m in out.items() for k, v in m.items()}


def _check_exact(what: str, a: dict, e: dict) -> None:
    for k, v in e.items():
        if not np.array_equal(a[k], v):
            raise ValueError(
                f"{what}: one float32 ulp of the initial weights changed {k!r}; the run sits on "
                "a tie: change SEED or Q_BIAS"
            )


def _max_move(a: dict, e: dict) -> float:
    return max(move(a[k], v) for k, v in e.items())


def generate_variant(pt, imp, trm_src: Path, variant: str, out: Path) -> dict:
    import torch

    config = pt.load_synced_config(compose(trm_src, COMMON + VARIANTS[variant]), 0, 1)
    sd = initial_state_dict(pt, config)
    ref = train_run(pt, imp, config, sd, every_carry=True)
    steps, final, final_exact, ts, ema, eval_loader = ref
    env, final_env = np.zeros(len(steps)), 0.0
    for seed in ENVELOPE_SEEDS:
        run = train_run(pt, imp, config, perturb_f32_ulp(sd, seed), every_carry=True)
        for i, ((ex_p, fl_p, in_p), (ex, fl, inp)) in enumerate(zip(run[0], steps, strict=True)):
            _check_exact(f"{variant} step {i + 1}", {**ex_p, **in_p}, {**ex, **inp})
            env[i] = max(env[i], _max_move(fl_p, fl))
        _check_exact(f"{variant} final", run[2], final_exact)
        final_env = max(final_env, _max_move(run[1], final))

    if max(env.max(), final_env) > MAX_ENVELOPE:
        raise ValueError(
            f"{variant}: the one-ulp envelope reached {max(env.max(), final_env):.1e} (step "
            f"{int(env.argmax()) + 1}): round-off grows chaotically in this run and would bound "
            'nothing (docs/porting_trm.md, "AdamATan2 in float32 amplifies round-off"): lower lr'
        )
    # launch's evaluation and checkpoint: the EMA copy, evaluate, save_train_state and the config
    ts_eval = ema_train_state(ts, ema)
    eval_metrics = run_evaluate(pt, config, ts_eval, eval_loader)
    eval_env = 0.0
    eval_sd = {k: v.detach().clone() for k, v in ts_eval.model.state_dict().items()}
    for seed in EVAL_ENVELOPE_SEEDS:
        moved = copy.deepcopy(ts_eval)
        moved.model.load_state_dict(perturb_f32_ulp(eval_sd, seed))
        eval_env = max(
            eval_env, _max_move(run_evaluate(pt, config, moved, eval_loader), eval_metrics)
        )
    pt.save_train_state(config, ts_eval)
    pt.save_code_and_config(config)
    ckpt_out = out / f"trm_train_{variant}_checkpoint"
    shutil.rmtree(ckpt_out, ignore_errors=True)
    ckpt_out.mkdir(parents=True)
    ckpt_name = f"step_{ts_eval.step}"
    for name in (ckpt_name, "all_config.yaml"):
        shutil.copy(Path(config.checkpoint_path) / name, ckpt_out / name)

    arrays = {f"init.{k}": v for k, v in sd.items()}
    for i, (exact, floats, inputs) in enumerate(steps):
        keep = {k: v for k, v in floats.items() if not k.startswith("param.")}
        if i % CARRY_EVERY and i != len(steps) - 1:
            keep = {k: v for k, v in keep.items() if k not in ("z_H", "z_L")}
        arrays.update({f"step.{i}.{k}": v for k, v in {**exact, **keep, **inputs}.items()})
    # the EMA weights are the checkpoint's parameters (launch saves the EMA model): kept once there
    kept = {k: v for k, v in {**final, **final_exact}.items() if not k.startswith("ema.")}
    arrays.update({f"final.{k}": v for k, v in kept.items()})
    arrays.update({f"eval.{k}": v for k, v in eval_metrics.items()})
    arrays["train.envelope"] = env
    arrays["final.envelope"] = np.float64(final_env)
    arrays["eval.envelope"] = np.float64(eval_env)
    name = save_npz(out, f"trm_train_{variant}", arrays).name
    halted = np.stack([ex["halted"] for ex, _, _ in steps])
    counts = np.stack([ex["steps"] for ex, _, _ in steps])
    return {
        "overrides": COMMON + VARIANTS[variant],
        "config": json.loads(json.dumps(config.model_dump())),
        "total_steps": int(ts.total_steps),
        "steps": len(steps),
        "files": [name, f"{ckpt_out.name}/{ckpt_name}", f"{ckpt_out.name}/all_config.yaml"],
        "halted_at_steps": sorted({int(c) for c in counts[halted]}),
        "envelope_max": float(max(env.max(), final_env)),
        "eval_envelope": eval_env,
        "torch_default_dtype": str(torch.get_default_dtype()),
    }


def generate(trm_src: Path, adam_src: Path, out: Path) -> dict:
    """Write trm_train_* into `out` and the `trm_train` section of OUT/manifest.json."""
    import torch

    from parity.goldens.trm_pretrain import pretrain

    trm_src, adam_src, out = Path(trm_src).resolve(), Path(adam_src).resolve(), Path(out).resolve()
    section = {
        "upstream": "SamsungSAILMontreal/TinyRecursiveModels",
        "commit": git_commit(trm_src),
        "adam_atan2": "imoneoi/adam-atan2",
        "adam_atan2_commit": git_commit(adam_src),
        "torch": torch.__version__,
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": 1,
        "numpy": np.__version__,
        "seed": SEED,
        "envelope_seeds": list(ENVELOPE_SEEDS),
        "eval_envelope_seeds": list(EVAL_ENVELOPE_SEEDS),
        "q_bias": list(Q_BIAS),
        "carry_every": CARRY_EVERY,
        "data_builder": {"module": "data.sudoku_easy", "seed": SEED, **DATA},
        "stand_ins": STAND_IN_REASONS,
        "variants": {},
    }
    threads, cwd = torch.get_num_threads(), os.getcwd()
    torch.set_num_threads(1)  # as the tests (tests/conftest.py): reduction order depends on it
    old_wandb = os.environ.get("WANDB_MODE")
    os.environ["WANDB_MODE"] = "disabled"
    try:
        section["machine"] = machine.identity()  # a run with the same kernels is bit-identical
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)  # relative data and checkpoint paths: all_config.yaml is the same bytes
            section["data_files"] = build_data(Path(tmp))
            with pretrain(trm_src, adam_src) as (pt, imp):
                import wandb

                wandb.init(mode="disabled")  # save_code_and_config writes only with a run
                try:
                    for variant in VARIANTS:
                        section["variants"][variant] = generate_variant(
                            pt, imp, trm_src, variant, out
                        )
                finally:
                    wandb.finish()
            os.chdir(cwd)
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
        if old_wandb is None:
            os.environ.pop("WANDB_MODE", None)
        else:
            os.environ["WANDB_MODE"] = old_wandb
    write_manifest(out, {"trm_train": section})
    return section


if __name__ == "__main__":  # python -m parity.goldens.trm_train TRM_SRC ADAM_SRC OUT
    print(json.dumps(generate(*map(Path, sys.argv[1:4])), indent=1))
