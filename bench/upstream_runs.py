"""One whole training run of upstream's own code, from a checkout, on the CPU (`bench curves`).

    python -m bench.upstream_runs nanogpt --src NANOGPT --data DIR --seed S --out DIR [-- ARGS]
    python -m bench.upstream_runs trm --src TRM --adam-atan2-src ADAM --data DIR --seed S
                                      --out DIR [--device cpu|cuda] [--log-every K]
                                      [-- HYDRA_OVERRIDES]

nanogpt: karpathy/nanoGPT's train.py executed as `python train.py config/train_shakespeare_char.py
ARGS` would run it, from a scratch working directory (train.py reads configurator.py, config/ and
data/<dataset>/ relative to it and writes its out_dir there), with `data/shakespeare_char` linked
to DIR (train.bin, val.bin, meta.pkl as data.shakespeare_char writes them). train.py seeds torch
with the literal 1337; for another seed that literal is replaced at load time, nothing else. It
prints its own eval lines (`step N: train loss ..., val loss ...`).

trm: SamsungSAILMontreal/TinyRecursiveModels' pretrain.py `launch` (parity/goldens/trm_pretrain.py
says what is stood in: device strings, torch.compile off, AdamATan2's CUDA kernel) with a Hydra
config composed from the checkout's config/ and HYDRA_OVERRIDES, on the data set at DIR. Its
wandb.log calls are recorded; each evaluation is printed as `eval step N: {json}`, and with
--log-every K every K-th training step as `train step N` (for its steps/s). wandb runs in the mode
WANDB_MODE says (disabled when unset); where wandb is not installed (a GPU machine's image), a
stand-in takes pretrain.py's `import wandb`: its calls are recorded and go nowhere, as in disabled
mode. --device cuda runs pretrain.py as upstream wrote it (no device rewrites), still eager and
with AdamATan2's reference kernel.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

from train.errors import user_errors

NANOGPT_SEED_LINE = "torch.manual_seed(1337 + seed_offset)"
NANOGPT_CONFIG = "config/train_shakespeare_char.py"


def run_nanogpt(src: Path, data: Path, seed: int, out: Path, args: list[str]) -> None:
    src, data, out = src.resolve(), data.resolve(), out.resolve()
    work = out / "cwd"
    (work / "data").mkdir(parents=True, exist_ok=True)
    for name in ("configurator.py", "config"):
        if not (work / name).exists():
            (work / name).symlink_to(src / name)
    link = work / "data" / "shakespeare_char"
    if not link.exists():
        link.symlink_to(data)
    text = (src / "train.py").read_text()
    if text.count(NANOGPT_SEED_LINE) != 1:
        raise SystemExit(f"{src}/train.py: expected one `{NANOGPT_SEED_LINE}` line to seed")
    if seed != 1337:
        text = text.replace(NANOGPT_SEED_LINE, f"torch.manual_seed({seed} + seed_offset)")
    os.chdir(work)
    sys.path.insert(0, str(src))  # train.py imports model.py from its own directory
    sys.argv = ["train.py", NANOGPT_CONFIG, *args]
    exec(compile(text, str(src / "train.py"), "exec"), {"__name__": "__main__"})  # noqa: S102


def wandb_stand_in() -> types.ModuleType:
    """What pretrain.py uses of wandb (init, log, Settings, run), doing nothing: for a machine
    without wandb, where disabled mode would do nothing too."""
    mod = types.ModuleType("wandb")
    mod.__doc__ = "stand-in: wandb is not installed; calls are accepted and dropped"
    mod.run = None  # pretrain.py's save_code_and_config returns early without a run
    mod.init = lambda *a, **k: None
    mod.log = lambda *a, **k: None
    mod.finish = lambda *a, **k: None
    mod.Settings = lambda *a, **k: dict(k)
    return mod


def run_trm(
    src: Path,
    adam: Path,
    data: Path,
    seed: int,
    out: Path,
    overrides: list[str],
    device: str = "cpu",
    log_every: int = 0,
) -> None:
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("WANDB_DIR", str(out))
    if importlib.util.find_spec("wandb") is None:
        sys.modules["wandb"] = wandb_stand_in()
    from hydra import compose, initialize_config_dir

    from parity.goldens.trm_pretrain import WandbRecorder, pretrain

    class Printing(WandbRecorder):
        def log(self, metrics: dict, step: int | None = None, **kwargs):
            result = super().log(metrics, step=step, **kwargs)
            if any(isinstance(v, dict) for v in metrics.values()):  # evaluate(): per set name
                print(f"eval step {step}: {json.dumps(self.records[-1][1])}", flush=True)
            elif log_every and step and step % log_every == 0:
                print(f"train step {step}", flush=True)
            return result

    src, adam, data, out = src.resolve(), adam.resolve(), data.resolve(), out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(out)  # pretrain.py's relative paths (wandb, checkpoints) land in the run's folder
    with pretrain(src, adam, device=device) as (pt, _imp):
        pt.wandb = Printing(pt.wandb)
        with initialize_config_dir(config_dir=str(src / "config"), version_base=None):
            cfg = compose(
                "cfg_pretrain",
                overrides=[
                    f"data_paths=[{data}]",
                    f"seed={seed}",
                    f"+checkpoint_path={out / 'checkpoints'}",
                    "+project_name=bench-curves",
                    f"+run_name=upstream-seed{seed}",
                    *overrides,
                ],
            )
        pt.launch.__wrapped__(cfg)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(prog="python -m bench.upstream_runs")
    p.add_argument("which", choices=["nanogpt", "trm"])
    p.add_argument("--src", required=True, type=Path)
    p.add_argument("--adam-atan2-src", type=Path)
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="trm only")
    p.add_argument("--log-every", type=int, default=0, help="trm only: print every K-th step")
    a = p.parse_args(argv)
    if a.which == "nanogpt":
        run_nanogpt(a.src, a.data, a.seed, a.out, rest)
    else:
        if a.adam_atan2_src is None:
            p.error("trm needs --adam-atan2-src (an imoneoi/adam-atan2 checkout)")
        run_trm(a.src, a.adam_atan2_src, a.data, a.seed, a.out, rest, a.device, a.log_every)


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        main()
