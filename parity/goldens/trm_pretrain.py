"""Upstream TRM's own training script (pretrain.py), imported from a checkout and run on the CPU
(or, with device="cuda", where upstream meant it to run).

    with pretrain(trm_src, adam_atan2_src) as (pt, imp):
        pt.init_train_state(...), pt.train_batch(...), pt.evaluate(...), pt.launch.__wrapped__(cfg)

What changes, and only at load time (the checkout is never written):
- pretrain.py's device strings: `"cuda"` -> `"cpu"` and `.cuda()` -> `.cpu()` (the nanoGPT
  generator runs train.py with `--device=cpu` the same way; none with device="cuda");
  `DISABLE_COMPILE=1`, pretrain.py's own switch for torch.compile.
- AdamATan2 is the adam-atan2 package's own class, imported from its checkout
  (imoneoi/adam-atan2). Only its CUDA kernel module `adam_atan2_backend` is a stand-in: it calls,
  per parameter, the pure-PyTorch reference implementation that the same package ships in its
  tests (adam_atan2/adam_atan2_test.py `_adam_atan2_reference_impl`), with the constants that test
  derives from the step count (lr / (1 - beta1^t), lr * weight_decay, sqrt(1 - beta2^t)).
- on a torch that renamed `Optimizer._cuda_graph_capture_health_check`, AdamATan2 gets the old
  name bound to the new one (`optimizer_compat`).
- the stand-ins of parity.goldens.trm (numba, argdantic) and its hiding of our own same-named
  packages (`models`, ...).

Everything else (train state, train_batch, SignSGD, the lr schedule, EMAHelper, evaluate, the
checkpoint and all_config.yaml it writes) is upstream's code as it is.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from pathlib import Path

# what pretrain.py and adam-atan2's test module import that the base install lacks: the
# `goldens` extra of pyproject.toml, with torch (hydra, wandb, tqdm, yaml come with the base
# install; pydantic too, through wandb, but pretrain.py imports it, so the extra names it)
GOLDENS_EXTRA = ("einops", "coolname", "pydantic", "pytest")
DEVICE_REWRITES = (('"cuda"', '"cpu"'), (".cuda()", ".cpu()"))


def _check_extra() -> None:
    missing = [m for m in GOLDENS_EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(
            f"running upstream TRM's pretrain.py needs {', '.join(missing)}: "
            "pip install -e '.[goldens]'"
        )


def adam_atan2_backend(adam_src: Path) -> types.ModuleType:
    """A stand-in for adam-atan2's CUDA extension `adam_atan2_backend`: the same in-place update,
    computed by the authors' pure-PyTorch reference (imported from `adam_src`'s test module)."""
    import torch

    test_file = Path(adam_src) / "adam_atan2" / "adam_atan2_test.py"
    if not test_file.is_file():
        raise FileNotFoundError(
            f"{test_file}: not an imoneoi/adam-atan2 checkout (--adam-atan2-src)"
        )

    @torch.no_grad()  # the CUDA kernel writes the tensors' storage; autograd never sees it
    def adam_atan2_cuda_impl_(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, wd):
        ref = sys.modules["adam_atan2.adam_atan2_test"]._adam_atan2_reference_impl
        for p, g, m, v, t in zip(params, grads, exp_avgs, exp_avg_sqs, steps, strict=True):
            step = int(t.item())  # the optimizer has already added 1 (torch._foreach_add_)
            new = ref(
                p,
                g,
                m,
                v,
                step_size=lr / (1 - beta1**step),
                wd_step_size=lr * wd,
                bias_correction2_sqrt=(1 - beta2**step) ** 0.5,
                beta1=beta1,
                beta2=beta2,
            )
            for dst, src in zip((p, m, v), new, strict=True):
                if dst.data_ptr() != src.data_ptr():  # the reference computed in a copy
                    dst.copy_(src)

    mod = types.ModuleType("adam_atan2_backend")
    mod.adam_atan2_cuda_impl_ = adam_atan2_cuda_impl_
    mod.__doc__ = "stand-in: adam_atan2_test._adam_atan2_reference_impl per parameter"
    return mod


def _load_rewritten(name: str, path: Path, rewrites=DEVICE_REWRITES) -> types.ModuleType:
    text = path.read_text()
    for old, new in rewrites:
        text = text.replace(old, new)
    mod = types.ModuleType(name)
    mod.__file__ = str(path)  # so upstream_on_path unloads it, and hydra finds config/ beside it
    sys.modules[name] = mod
    exec(compile(text, str(path), "exec"), mod.__dict__)  # noqa: S102 - upstream's own code
    return mod


def optimizer_compat(cls: type) -> type:
    """Let an optimizer written for an older torch run on this one (the class itself is changed,
    torch is not): AdamATan2.step calls `Optimizer._cuda_graph_capture_health_check`, which torch
    2.11 has only as `_accelerator_graph_capture_health_check` (the same check; on the H100 image
    the upstream TRM run stopped at its first step with an AttributeError without this)."""
    import torch

    old, new = "_cuda_graph_capture_health_check", "_accelerator_graph_capture_health_check"
    base = torch.optim.Optimizer
    if not hasattr(base, old) and hasattr(base, new):
        setattr(cls, old, getattr(base, new))
    return cls


@contextlib.contextmanager
def pretrain(trm_src: Path, adam_src: Path, device: str = "cpu"):
    """Yield (upstream's pretrain module, an importer of upstream's modules), everything unloaded
    afterwards. `device`: "cpu" (its device strings rewritten) or "cuda" (left as they are)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"pretrain: device must be 'cpu' or 'cuda', got {device!r}")
    _check_extra()
    from parity.goldens.trm import upstream

    trm_src, adam_src = Path(trm_src).resolve(), Path(adam_src).resolve()
    if not (trm_src / "pretrain.py").is_file():
        raise FileNotFoundError(f"{trm_src}/pretrain.py: not a TinyRecursiveModels checkout")
    backend = adam_atan2_backend(adam_src)
    old_env = os.environ.get("DISABLE_COMPILE")
    os.environ["DISABLE_COMPILE"] = "1"
    sys.modules["adam_atan2_backend"] = backend
    sys.path.insert(0, str(adam_src))
    try:
        with upstream(trm_src) as imp:
            optimizer_compat(importlib.import_module("adam_atan2").AdamATan2)
            importlib.import_module("adam_atan2.adam_atan2_test")
            rewrites = DEVICE_REWRITES if device == "cpu" else ()
            yield _load_rewritten("pretrain", trm_src / "pretrain.py", rewrites), imp
    finally:
        sys.path.remove(str(adam_src))
        for k in [k for k in sys.modules if k == "adam_atan2" or k.startswith("adam_atan2")]:
            del sys.modules[k]
        sys.modules.pop("pretrain", None)
        if old_env is None:
            os.environ.pop("DISABLE_COMPILE", None)
        else:
            os.environ["DISABLE_COMPILE"] = old_env


class WandbRecorder(types.ModuleType):
    """Stands where pretrain.py's module global `wandb` is: every attribute is the real wandb's
    (wandb.init rebinds wandb.log, so the real module is looked up at each call), and `log` also
    appends (step, metrics as floats) to `self.records` before handing the call on."""

    def __init__(self, real: types.ModuleType):
        super().__init__("wandb")
        self._real = real
        self.records: list[tuple[int | None, dict]] = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def log(self, metrics: dict, step: int | None = None, **kwargs):
        self.records.append((step, _floats(metrics)))
        return self._real.log(metrics, step=step, **kwargs)


def _floats(tree):
    if isinstance(tree, dict):
        return {str(k): _floats(v) for k, v in tree.items()}
    return float(tree)
