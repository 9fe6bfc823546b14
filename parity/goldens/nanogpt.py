"""Golden copies from karpathy/nanoGPT's own code: `generate(src, out)`.

Everything numeric below is computed by upstream's files in the checkout `src`, run on the CPU:
- model.py (GPT, GPTConfig) is imported from `src`: forward, loss, gradients, configure_optimizers,
  generate;
- train.py is run as a whole (exec of its text, as `python train.py --key=value ...` would run it)
  in a temporary directory holding a small synthetic token file, so its own get_batch, get_lr,
  gradient accumulation, clip_grad_norm_, AdamW steps and seed (1337) produce the three steps. It is
  only observed: global module forward hooks (the batches, the losses), global optimizer step hooks
  (the parameters before and after each step, the lr of each group) and a wrapper that records
  what torch.nn.utils.clip_grad_norm_ returns;
- get_lr at the boundaries: the function's source is taken from train.py with `ast` and executed
  with the two settings' values, which are read (also with `ast`) from train.py's defaults (owt)
  and config/train_shakespeare_char.py.

Nothing had to be stood in for: model.py and train.py need no CUDA when device='cpu'. The
manifest (OUT/manifest.json, section "nanogpt") records the commit, torch version, configs, seeds
and each of the observation points above. Fixture files (all `.npz`, float32 and float64):

- forward_{bias,no_bias}.npz: `state/<key>` (float32, upstream's state_dict keys; no_bias as
  torch.compile names them, `_orig_mod.<key>`), `idx`, `targets`, per dtype `<dtype>/logits`,
  `<dtype>/loss`, `<dtype>/logits_last` (inference: last position only), `<dtype>/grad/<name>`;
  the float64 model is upstream's float32 model after `.double()` (exact widening), and the
  param groups of configure_optimizers: `groups/<i>/names`, `groups/<i>/<hyperparameter>`;
- train_{float32,float64}.npz: train.py's run: `init/<key>`, `x`, `y` ([iters, accum, B, T]),
  `loss` ([iters, accum]), `lr`, `grad_norm` (before clipping), `step<k>/<key>` after step k,
  `envelope` (per step: how far one ulp of the initial weights moves upstream's own run);
- get_lr.npz: `<setting>/it`, `<setting>/lr` for shakespeare_char and owt;
- generate.npz: upstream's GPT.generate on the forward_bias weights in float64 with every matrix
  (ndim >= 2) multiplied by GENERATE_SCALE (so an untrained model's choices change from step to
  step): `prompt`, `greedy` (top_k=1), `sampled` (temperature, top_k, torch seed) and `probs`
  ([steps, B, V], the distribution torch.multinomial drew each token from).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import io
import math
import os
import pickle
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from parity import machine
from parity.envelope import move, perturb_one_ulp_
from parity.goldens.common import git_commit, save_npz, upstream_on_path, write_manifest

FORWARD_CONFIGS = {
    "bias": dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=65, bias=True),
    # odd shapes (3 heads of 8, vocab 50, block 12) so a transposed or mis-split matrix cannot pass
    "no_bias": dict(n_layer=2, n_head=3, n_embd=24, block_size=12, vocab_size=50, bias=False),
}
FORWARD_SEED = 0  # torch.manual_seed before GPT(config)
BATCH_SEED = 1  # torch.Generator for the batch
BATCH_SIZE = 3
OPTIM = dict(weight_decay=0.1, learning_rate=6e-4, betas=(0.9, 0.95), device_type="cpu")

# train.py run: --key=value overrides (train.py's own defaults otherwise: bias False, seed 1337,
# AdamW betas (0.9, 0.95), weight_decay 0.1). warmup 1 and decay over 2 iterations put the three
# steps in the three phases of get_lr (warmup, cosine start, min_lr); grad_clip sits between the
# raw gradient norms of the run, so that clipping is active in some steps and not in others.
TRAIN_OVERRIDES = dict(
    device="cpu",
    compile=False,
    dtype="float32",
    dataset="goldens",
    out_dir="out-goldens",
    n_layer=2,
    n_head=2,
    n_embd=16,
    block_size=16,
    batch_size=2,
    gradient_accumulation_steps=2,
    learning_rate=1e-2,
    min_lr=1e-3,
    warmup_iters=1,
    lr_decay_iters=2,
    max_iters=2,  # train.py stops after iter_num > max_iters: iterations 0, 1, 2 = three steps
    eval_interval=1000,
    eval_iters=1,
    log_interval=1,
    grad_clip=0.74,
)
ENVELOPE_SEEDS = (1, 2)  # one-ulp perturbations of train.py's initial weights (parity/envelope.py)
TRAIN_VOCAB = 65
TRAIN_DATA_SEED = 0
TRAIN_DATA_LEN = 4096

LR_SETTINGS = {"owt": None, "shakespeare_char": "config/train_shakespeare_char.py"}
LR_NAMES = ("learning_rate", "warmup_iters", "lr_decay_iters", "min_lr")

GENERATE_SCALE = 15.0
GENERATE = dict(max_new_tokens=20, temperature=0.8, top_k=5, seed=3)
GENERATE_PROMPT = [[1, 5, 9, 2, 7], [3, 3, 8, 0, 11]]


@contextlib.contextmanager
def _quiet():
    """Upstream prints progress, and train.py's torch.cuda.amp.GradScaler warns it is deprecated."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.compile imports torch.jit
        yield


def _load_model_py(src: Path):
    """upstream's model.py as a module (a private name, so no other `model` module is shadowed)."""
    spec = importlib.util.spec_from_file_location("_nanogpt_upstream_model", src / "model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _batch(cfg: dict):
    import torch

    g = torch.Generator().manual_seed(BATCH_SEED)
    shape = (BATCH_SIZE, cfg["block_size"])
    return torch.randint(0, cfg["vocab_size"], shape, generator=g), torch.randint(
        0, cfg["vocab_size"], shape, generator=g
    )


def _groups(model, optimizer) -> dict:
    """configure_optimizers' param groups by parameter name, with every hyperparameter torch kept."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for i, group in enumerate(optimizer.param_groups):
        out[f"groups/{i}/names"] = np.array([names[id(p)] for p in group["params"]])
        for k, v in group.items():
            if k != "params" and isinstance(v, (int, float, bool, tuple)):
                out[f"groups/{i}/{k}"] = np.array(v, dtype=np.float64)
    return out


def _forward(mod, name: str, cfg: dict) -> dict:
    import torch

    torch.manual_seed(FORWARD_SEED)
    with _quiet():
        model = mod.GPT(mod.GPTConfig(**cfg, dropout=0.0))
    # torch.compile wraps lazily (nothing is compiled until the first call): its state_dict has
    # the `_orig_mod.` keys train.py saves in ckpt.pt when compile=True.
    with _quiet():
        state = (torch.compile(model) if name == "no_bias" else model).state_dict()
    arrays = {f"state/{k}": v.clone() for k, v in state.items()}
    idx, targets = _batch(cfg)
    arrays.update(idx=idx, targets=targets)
    with _quiet():
        optimizer = model.configure_optimizers(**OPTIM)
    arrays.update(_groups(model, optimizer))
    for dtype in ("float32", "float64"):
        m = model if dtype == "float32" else model.double()
        m.eval()  # dropout is 0: train and eval differ only in nothing; eval as generate uses it
        m.zero_grad(set_to_none=True)
        logits, loss = m(idx, targets)
        loss.backward()
        arrays[f"{dtype}/logits"], arrays[f"{dtype}/loss"] = logits, loss
        for n, p in m.named_parameters():
            arrays[f"{dtype}/grad/{n}"] = p.grad.clone()
        with torch.no_grad():
            arrays[f"{dtype}/logits_last"] = m(idx)[0]
    return arrays


def _is_train_py_gpt(module) -> bool:
    return type(module).__name__ == "GPT" and module.__module__ == "model"


def _pre_forward(record: dict, module, args):
    if not _is_train_py_gpt(module):
        return
    if record["perturb"] is not None and "perturbed" not in record:
        perturb_one_ulp_(module, record["perturb"])  # its first call: before any step
        record["perturbed"] = True
    if module.training:
        record["batches"].append((args[0].clone(), args[1].clone()))
        record["model"] = module


def _post_forward(record: dict, module, args, output):
    if _is_train_py_gpt(module) and module.training:
        record["losses"].append(output[1].detach().clone())


def _pre_step(record: dict, optimizer, args, kwargs):
    if not record["steps"]:
        record["init"] = _named_state(record["model"])


def _post_step(record: dict, optimizer, args, kwargs):
    if not record["steps"]:
        record["groups"] = _groups(record["model"], optimizer)
    record["lr"].append([g["lr"] for g in optimizer.param_groups])
    record["steps"].append(_named_state(record["model"]))


@contextlib.contextmanager
def _observe_training(record: dict):
    """Global torch hooks that watch train.py's run (and, for an envelope run, move its initial
    weights by one ulp); a wrapper records what clip_grad_norm_ returns, unchanged."""
    import torch
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(*args, **kwargs):
        norm = real_clip(*args, **kwargs)
        record["grad_norm"].append(norm.detach().clone())
        return norm

    handles = [
        register_module_forward_pre_hook(functools.partial(_pre_forward, record)),
        register_module_forward_hook(functools.partial(_post_forward, record)),
        register_optimizer_step_pre_hook(functools.partial(_pre_step, record)),
        register_optimizer_step_post_hook(functools.partial(_post_step, record)),
    ]
    torch.nn.utils.clip_grad_norm_ = clip
    try:
        yield
    finally:
        torch.nn.utils.clip_grad_norm_ = real_clip
        for h in handles:
            h.remove()


def _named_state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _argv_value(v) -> str:
    return repr(v) if isinstance(v, (bool, int, float)) else str(v)


def _write_data(root: Path) -> None:
    data = root / "data" / TRAIN_OVERRIDES["dataset"]
    data.mkdir(parents=True)
    rng = np.random.default_rng(TRAIN_DATA_SEED)
    for split in ("train", "val"):
        rng.integers(0, TRAIN_VOCAB, TRAIN_DATA_LEN, dtype=np.uint16).tofile(data / f"{split}.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": TRAIN_VOCAB}, f)


def _train(src: Path, dtype: str, perturb: int | None = None) -> dict:
    """Run upstream's train.py (three iterations) and return what the hooks saw. `perturb`: a
    seed; the model's weights are moved by one ulp (parity.envelope) at its first call."""
    import torch

    record = {"batches": [], "losses": [], "lr": [], "grad_norm": [], "steps": []}
    record["perturb"] = perturb
    argv = ["train.py"] + [f"--{k}={_argv_value(v)}" for k, v in TRAIN_OVERRIDES.items()]
    code = compile((src / "train.py").read_text(), str(src / "train.py"), "exec")
    cwd, saved_argv, saved_dtype = os.getcwd(), sys.argv, torch.get_default_dtype()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write_data(root)
        (root / "configurator.py").symlink_to(src / "configurator.py")  # train.py opens it by name
        try:
            os.chdir(root)
            sys.argv = argv
            # train.py has no float64 option (its `dtype` only picks CUDA autocast); the float64
            # run creates the model with torch's default dtype float64, nothing else changes.
            torch.set_default_dtype(getattr(torch, dtype))
            with _observe_training(record), _quiet():
                exec(code, {"__name__": "__main__", "__file__": str(src / "train.py")})
        finally:
            os.chdir(cwd)
            sys.argv = saved_argv
            torch.set_default_dtype(saved_dtype)
    A = TRAIN_OVERRIDES["gradient_accumulation_steps"]
    n = len(record["steps"])
    x = torch.stack([b[0] for b in record["batches"]]).reshape(n, A, *record["batches"][0][0].shape)
    y = torch.stack([b[1] for b in record["batches"]]).reshape(x.shape)
    arrays = {"x": x, "y": y, "loss": torch.stack(record["losses"]).reshape(n, A)}
    arrays["lr"] = np.array([lrs[0] for lrs in record["lr"]], np.float64)
    assert all(len(set(lrs)) == 1 for lrs in record["lr"]), "train.py sets one lr on every group"
    arrays["grad_norm"] = torch.stack(record["grad_norm"])
    arrays.update(record["groups"])
    arrays.update({f"init/{k}": v for k, v in record["init"].items()})
    for i, state in enumerate(record["steps"]):
        arrays.update({f"step{i + 1}/{k}": v for k, v in state.items()})
    return arrays


def _envelope(reference: dict, perturbed: list[dict]) -> np.ndarray:
    """Per step: the largest scale-relative move, over the perturbed runs, of the loss, the
    gradient norm and every parameter (parity/envelope.py's measure, from upstream's own run)."""
    n = reference["x"].shape[0]
    out = np.zeros(n)
    for run in perturbed:
        assert np.array_equal(run["x"], reference["x"]), "one ulp changed train.py's batches"
        for k in range(n):
            pairs = [(run["loss"][k], reference["loss"][k])]
            pairs.append((run["grad_norm"][k], reference["grad_norm"][k]))
            prefix = f"step{k + 1}/"
            pairs += [(v, reference[name]) for name, v in run.items() if name.startswith(prefix)]
            out[k] = max(out[k], *(move(a, e) for a, e in pairs))
    return out


def _module_assignments(path: Path, names) -> dict:
    """Top-level `name = literal` assignments of a Python file, read with ast (nothing executed)."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in names:
                out[target.id] = ast.literal_eval(node.value)
    return out


def _upstream_get_lr(src: Path, settings: dict):
    """train.py's own get_lr function, compiled from its source text, with `settings` as its
    globals (train.py reads learning_rate, warmup_iters, lr_decay_iters, min_lr as globals)."""
    text = (src / "train.py").read_text()
    fn = next(
        n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "get_lr"
    )
    namespace = {"math": math, **settings}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(src / "train.py"), "exec"), namespace)
    return namespace["get_lr"]


def _get_lr(src: Path) -> tuple[dict, dict]:
    arrays, settings_out = {}, {}
    defaults = _module_assignments(src / "train.py", LR_NAMES)
    for setting, config_file in LR_SETTINGS.items():
        settings = dict(defaults)
        if config_file:
            settings.update(_module_assignments(src / config_file, LR_NAMES))
        get_lr = _upstream_get_lr(src, settings)
        w, d = settings["warmup_iters"], settings["lr_decay_iters"]
        its = sorted({0, 1, w // 2, w - 1, w, w + 1, (w + d) // 2, d - 1, d, d + 1, 2 * d})
        arrays[f"{setting}/it"] = np.array(its, np.int64)
        arrays[f"{setting}/lr"] = np.array([get_lr(i) for i in its], np.float64)
        settings_out[setting] = {"from": config_file or "train.py defaults", **settings}
    return arrays, settings_out


def generate_weights(state: dict, dtype=np.float64) -> dict:
    """The weights generate.npz was made with: forward_bias's state in `dtype`, every matrix
    (ndim >= 2) times GENERATE_SCALE (one correctly rounded multiply, the same bits anywhere)."""
    out = {}
    for k, v in state.items():
        v = np.asarray(v).astype(dtype)
        out[k] = v * dtype(GENERATE_SCALE) if v.ndim >= 2 else v
    return out


def _generate(mod, forward_bias: dict) -> dict:
    import torch

    cfg = FORWARD_CONFIGS["bias"]
    with _quiet():
        model = mod.GPT(mod.GPTConfig(**cfg, dropout=0.0)).double().eval()
    state = {k.removeprefix("state/"): v for k, v in forward_bias.items() if k.startswith("state/")}
    weights = generate_weights({k: v.numpy() for k, v in state.items()})
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    prompt = torch.tensor(GENERATE_PROMPT)
    n = GENERATE["max_new_tokens"]
    greedy = model.generate(prompt, n, temperature=1.0, top_k=1)
    probs = []
    real_multinomial = torch.multinomial

    def multinomial(p, *args, **kwargs):  # records the rows upstream samples from
        probs.append(p.detach().clone())
        return real_multinomial(p, *args, **kwargs)

    torch.manual_seed(GENERATE["seed"])
    torch.multinomial = multinomial
    try:
        sampled = model.generate(
            prompt, n, temperature=GENERATE["temperature"], top_k=GENERATE["top_k"]
        )
    finally:
        torch.multinomial = real_multinomial
    return {"prompt": prompt, "greedy": greedy, "sampled": sampled, "probs": torch.stack(probs)}


def _generate_all(src: Path, out: Path) -> tuple[dict, dict]:
    files = {}
    with upstream_on_path(src):
        mod = _load_model_py(src)
        forward = {}
        for name, cfg in FORWARD_CONFIGS.items():
            forward[name] = _forward(mod, name, cfg)
            files[f"forward_{name}"] = save_npz(out, f"forward_{name}", forward[name])
        for dtype in ("float32", "float64"):
            arrays = _train(src, dtype)
            arrays["envelope"] = _envelope(
                arrays, [_train(src, dtype, seed) for seed in ENVELOPE_SEEDS]
            )
            files[f"train_{dtype}"] = save_npz(out, f"train_{dtype}", arrays)
        lr_arrays, lr_settings = _get_lr(src)
        files["get_lr"] = save_npz(out, "get_lr", lr_arrays)
        files["generate"] = save_npz(out, "generate", _generate(mod, forward["bias"]))
    return files, lr_settings


def generate(src: Path, out: Path) -> dict:
    """Run upstream nanoGPT from checkout `src` and write the fixtures and manifest to `out`."""
    import torch

    src = Path(src).resolve()
    out = Path(out)
    threads = torch.get_num_threads()
    # ATen splits reductions by thread: another thread count gives other float32 bits (measured:
    # a LayerNorm weight gradient 1.4e-7 of scale apart). One thread, whatever the machine.
    torch.set_num_threads(1)
    try:
        here = machine.identity()
        files, lr_settings = _generate_all(src, out)
    finally:
        torch.set_num_threads(threads)
    section = {
        "upstream": "karpathy/nanoGPT",
        "commit": git_commit(src),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": 1,
        # float bits are reproducible on the same kernels (CPU, torch, ATen, MKL's code path,
        # threads: parity/machine.py); elsewhere within float round-off
        "machine": here,
        "stand_ins": {},
        "stand_ins_why": "none needed: model.py and train.py (device='cpu') run on a CPU as is",
        "forward": {
            "configs": FORWARD_CONFIGS,
            "dropout": 0.0,
            "seed": f"torch.manual_seed({FORWARD_SEED}) before GPT(config)",
            "batch": f"torch.Generator().manual_seed({BATCH_SEED}): randint idx then targets, "
            f"({BATCH_SIZE}, block_size)",
            "float64": "the float32 model after .double() (the same weights, widened exactly)",
            "no_bias_keys": "torch.compile(model).state_dict(): `_orig_mod.` as in a compiled "
            "run's ckpt.pt (compile is lazy: nothing was compiled)",
            "configure_optimizers": {**OPTIM, "betas": list(OPTIM["betas"])},
        },
        "train": {
            "how": "train.py executed as a script (sys.argv = the overrides, cwd = a temporary "
            "directory with data/<dataset>/{train,val}.bin, meta.pkl and a link to "
            "configurator.py); observed through torch's global module forward hooks, global "
            "optimizer step pre/post hooks and a recording wrapper around "
            "torch.nn.utils.clip_grad_norm_ (the result is returned unchanged)",
            "overrides": TRAIN_OVERRIDES,
            "data": f"np.random.default_rng({TRAIN_DATA_SEED}).integers(0, {TRAIN_VOCAB}, "
            f"{TRAIN_DATA_LEN}, uint16) for train.bin then val.bin; meta.pkl vocab_size "
            f"{TRAIN_VOCAB}",
            "seed": "train.py's own torch.manual_seed(1337)",
            "envelope": f"train.py run again with its initial weights moved by one ulp "
            f"(parity.envelope.perturb_one_ulp_, seeds {list(ENVELOPE_SEEDS)}, at the model's "
            "first call); per step the largest scale-relative move of loss, gradient norm and "
            "every parameter",
            "float64": "torch.set_default_dtype(torch.float64) around the run (train.py's dtype "
            "option only selects CUDA autocast), so the model is created in float64",
        },
        "get_lr": {
            "how": "train.py's get_lr compiled from its source (ast) with the setting's values "
            "as globals; values read with ast from train.py and the config file",
            "settings": lr_settings,
        },
        "generate": {
            **GENERATE,
            "prompt": GENERATE_PROMPT,
            "weights": f"forward_bias state in float64, every ndim >= 2 tensor x {GENERATE_SCALE}",
            "probs": "each row passed to torch.multinomial, recorded by a wrapper that calls it",
            "greedy": "model.generate(prompt, max_new_tokens, temperature=1.0, top_k=1)",
        },
        "files": sorted(f"{p.name}" for p in files.values()),
    }
    write_manifest(out, {"nanogpt": section})
    return section
