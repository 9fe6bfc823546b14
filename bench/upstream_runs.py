"""One whole training run of upstream's own code, from a checkout (`bench curves`, `bench gpu`).

    python -m bench.upstream_runs nanogpt --src NANOGPT --data DIR --seed S --out DIR [-- ARGS]
    python -m bench.upstream_runs trm --src TRM --adam-atan2-src ADAM --experiment NAME --data DIR
                                      --seed S --out DIR [--device cpu|cuda] [--log-every K]
                                      [--train-only]

nanogpt: nanoGPT's train.py as `python train.py config/train_shakespeare_char.py ARGS` runs it,
from a scratch directory whose data/shakespeare_char is DIR; for a seed other than train.py's
literal 1337 that literal is replaced at load time, nothing else. trm: TinyRecursiveModels'
pretrain.py `launch` (parity/goldens/trm_pretrain.py stands in what a CPU lacks) with its config
mapped key for key from our experiment (bench.curves.upstream_trm_overrides); it prints each
evaluation as `eval step N: {json}` and, with --log-every K, every K-th step as `train step N`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

from train.errors import ConfigError, OneLineParser, user_errors

NANOGPT_SEED_LINE = "torch.manual_seed(1337 + seed_offset)"


def run_nanogpt(src: Path, data: Path, seed: int, out: Path, args: list[str]) -> None:
    src, work = src.resolve(), out.resolve() / "cwd"
    (work / "data").mkdir(parents=True, exist_ok=True)
    for link, target in (("configurator.py", src / "configurator.py"), ("config", src / "config"),
                         ("data/shakespeare_char", data.resolve())):  # fmt: skip
        if not (work / link).exists():
            (work / link).symlink_to(target)
    text = (src / "train.py").read_text()
    if text.count(NANOGPT_SEED_LINE) != 1:
        raise ConfigError(f"{src}/train.py: expected one `{NANOGPT_SEED_LINE}` line to seed")
    text = text.replace(NANOGPT_SEED_LINE, f"torch.manual_seed({seed} + seed_offset)")
    os.chdir(work)
    sys.path.insert(0, str(src))  # train.py imports model.py from its own directory
    sys.argv = ["train.py", "config/train_shakespeare_char.py", *args]
    exec(compile(text, str(src / "train.py"), "exec"), {"__name__": "__main__"})  # noqa: S102


def wandb_stand_in() -> types.ModuleType:
    """What pretrain.py uses of wandb (init, log, Settings, run), doing nothing."""
    mod = types.ModuleType("wandb")
    mod.run = None  # pretrain.py's save_code_and_config returns early without a run
    mod.init = mod.log = mod.finish = lambda *a, **k: None
    mod.Settings = lambda *a, **k: dict(k)
    return mod


def run_trm(a, overrides: list[str]) -> None:
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("WANDB_DIR", str(a.out))
    if importlib.util.find_spec("wandb") is None:
        sys.modules["wandb"] = wandb_stand_in()
    from hydra import compose, initialize_config_dir

    from bench.curves import trainer_config, upstream_trm_overrides
    from parity.goldens.trm_pretrain import WandbRecorder, pretrain

    class Printing(WandbRecorder):
        def log(self, metrics: dict, step: int | None = None, **kwargs):
            result = super().log(metrics, step=step, **kwargs)
            if any(isinstance(v, dict) for v in metrics.values()):  # evaluate(): per set name
                print(f"eval step {step}: {json.dumps(self.records[-1][1])}", flush=True)
            elif a.log_every and step and step % a.log_every == 0:
                print(f"train step {step}", flush=True)
            return result

    src, out = a.src.resolve(), a.out.resolve()
    cfg = trainer_config(a.experiment)
    ours = upstream_trm_overrides(cfg)
    if a.train_only:  # its one evaluation after the last epoch (a data set without a test split)
        ours.append(f"eval_interval={cfg['trainer']['epochs']}")
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(out)  # pretrain.py's relative paths (wandb, checkpoints) land in the run's folder
    with pretrain(src, a.adam_atan2_src.resolve(), device=a.device) as (pt, _imp):
        pt.wandb = Printing(pt.wandb)
        with initialize_config_dir(config_dir=str(src / "config"), version_base=None):
            cfg = compose("cfg_pretrain", overrides=[
                f"data_paths=[{a.data.resolve()}]", f"seed={a.seed}",
                f"+checkpoint_path={out / 'checkpoints'}", "+project_name=bench",
                f"+run_name=upstream-seed{a.seed}", *ours, *overrides])  # fmt: skip
        pt.launch.__wrapped__(cfg)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, rest = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    p = OneLineParser(prog="python -m bench.upstream_runs")
    p.add_argument("which", choices=["nanogpt", "trm"])
    p.add_argument("--src", required=True, type=Path)
    p.add_argument("--adam-atan2-src", type=Path)
    p.add_argument("--experiment", help="trm: our experiment whose settings upstream runs")
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="trm only")
    p.add_argument("--log-every", type=int, default=0, help="trm only: print every K-th step")
    p.add_argument(
        "--train-only", action="store_true", help="trm only: no evaluation before the end"
    )
    a = p.parse_args(argv)
    if a.which == "nanogpt":
        run_nanogpt(a.src, a.data, a.seed, a.out, rest)
    elif a.adam_atan2_src is None or a.experiment is None:
        p.error("trm needs --adam-atan2-src (an imoneoi/adam-atan2 checkout) and --experiment")
    else:
        run_trm(a, rest)


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        main()
