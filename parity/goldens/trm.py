"""TRM golden fixtures from SamsungSAILMontreal/TinyRecursiveModels, run from a checkout on the CPU.

`generate(src, out)` imports upstream's model, loss head, ARC evaluator and PuzzleDataset from
`src` and writes, for the variants mlp_t, att (RoPE), learned (learned positions) and hrm:

- OUT/trm_<variant>_state_dict.npz: the float32 state_dict exactly as upstream's pretrain.py saves
  it (the loss head wrapped by torch.compile: `_orig_mod.model.inner.*` keys);
- OUT/trm_<variant>_<dtype>.npz (float32 and float64): per ACT step of an eval rollout (one batch,
  halt_max_steps steps) and of a train rollout (a new batch every step, so halted slots refill) the
  carry (z_H, z_L, steps, halted, held data), logits, q_halt/q_continue (hrm: target_q_continue),
  the loss head's loss and metrics, and in train mode the exploration draws upstream took from
  torch's global RNG (`explore_u` = rand_like, `explore_k` = randint_like); the gradient of every
  parameter and of the gathered puzzle-embedding rows for one train step; and the float32-ulp
  envelope of each (below);
- OUT/trm_arc_eval.npz, OUT/trm_puzzle_dataset.npz: see parity/goldens/trm_data.py.
- manifest `upstream_bugs`: what upstream raised on the three paths docs/porting_trm.md lists as
  its bugs (upstream_bugs).

The float32-ulp envelope: upstream re-run twice with every weight moved by one float32 ulp (a
random direction per element): per step, the largest scale-relative move of any float tensor. It
says how far one float32 rounding's worth of difference has grown by that step, in upstream's own
run; the tests bound the port by parity.envelope.ENVELOPE_FACTOR times it. A float32 ulp (not a
float64 one) because upstream's "float64" forward still computes rms_norm and RoPE in float32 and
casts q to float32 (models/layers.py, trm.py): its round-off is float32-sized even in float64.

Float64 runs: upstream's own `forward_dtype="float64"`, plus the loss head's `.double()` so the
parameters (float32 values, exact in float64) give float64 gradients; `.double()` turns the
puzzle table's `local_weights` gradient leaf into a non-leaf copy, so it is replaced by a fresh
float64 leaf. Everything else is upstream's code unchanged.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import types
from pathlib import Path

import numpy as np

from parity import machine
from parity.envelope import move
from parity.goldens import trm_data
from parity.goldens.common import git_commit, save_npz, upstream_on_path, write_manifest
from parity.trm_fixtures import TINY

SEED = 0
ENVELOPE_SEEDS = (1, 2)
TRAIN_STEPS = 5
# The tests' tiny TRM (parity.trm_fixtures.TINY) made smaller still, so the fixtures stay small
# and rows halt at different steps within 4 (upstream's model_cfg layout: `causal` is passed by
# pretrain.create_model and ignored by the models)
BASE = dict(
    TINY,
    batch_size=3,
    puzzle_emb_ndim=16,
    hidden_size=16,
    num_heads=2,
    halt_max_steps=4,
    halt_exploration_prob=0.5,
    puzzle_emb_len=2,
    no_ACT_continue=True,
    causal=False,
)
VARIANTS = {
    "mlp_t": (
        "models.recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1",
        dict(mlp_t=True, pos_encodings="none"),
    ),
    "att": ("models.recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1", {}),
    "learned": (
        "models.recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1",
        dict(pos_encodings="learned"),
    ),
    "hrm": ("models.recursive_reasoning.hrm@HierarchicalReasoningModel_ACTV1", dict(H_layers=2)),
}
# float32 gradients are kept for two variants only (fixture size); float64 for all four
FLOAT32_GRAD_VARIANTS = ("mlp_t", "att")
Q_BIAS = (0.3, -0.3)  # q_halt, q_continue: rows halt at different steps (att, mlp_t, hrm)
LOSS = "stablemax_cross_entropy"
# Top-level names upstream's files import that this repository also defines (our `models`
# package): hidden from sys.modules while upstream is imported, put back afterwards.
SHADOWED = ("models", "dataset", "evaluators", "utils", "puzzle_dataset", "pretrain")

STAND_IN_REASONS = {
    "numba": "not installed; evaluators/arc.py decorates _crop with numba.njit: a no-op decorator "
    "runs the same Python function",
    "argdantic": "not installed; dataset/build_arc_dataset.py and puzzle_dataset.py create an "
    "ArgParser at import time (command-line parsing only, never called here)",
}


def model_config(variant: str, dtype: str) -> dict:
    """The upstream config dict of a variant (pretrain.create_model's model_cfg layout)."""
    cfg = dict(BASE, forward_dtype=dtype)
    cfg.update(VARIANTS[variant][1])
    return cfg


def _stand_ins() -> dict[str, types.ModuleType]:
    numba = types.ModuleType("numba")
    numba.njit = lambda *a, **k: a[0] if a and callable(a[0]) else (lambda f: f)
    argdantic = types.ModuleType("argdantic")

    class ArgParser:
        def __init__(self, *a, **k):
            pass

        def command(self, *a, **k):
            return lambda f: f

        def __call__(self, *a, **k):
            raise RuntimeError("argdantic stand-in: command-line parsing is not available")

    argdantic.ArgParser = ArgParser
    return {"numba": numba, "argdantic": argdantic}


@contextlib.contextmanager
def upstream(src: Path):
    """upstream_on_path, with our own same-named top-level packages hidden meanwhile."""
    import torch._dynamo  # noqa: F401
    import torch.distributed  # noqa: F401

    # torch.compile imports torch._dynamo on first use, which walks sys.modules with inspect; an
    # upstream namespace package (`models`, no __file__) there makes that import fail: import first
    hidden = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] in SHADOWED}
    # upstream's models/ has no __init__.py: a namespace package, which loses to any regular
    # `models` package anywhere on sys.path (ours): hide the path entries that hold one
    saved_path = list(sys.path)
    sys.path[:] = [
        p
        for p in sys.path
        if not any((Path(p or ".") / n / "__init__.py").exists() for n in SHADOWED)
    ]
    importlib.invalidate_caches()
    try:
        with upstream_on_path(src, _stand_ins()):
            yield lambda name: importlib.import_module(name)
    finally:
        sys.path[:] = saved_path
        importlib.invalidate_caches()
        for k in list(sys.modules):
            if k.split(".")[0] in SHADOWED:
                del sys.modules[k]
        sys.modules.update(hidden)


def _cls(imp, spec: str):
    mod, name = spec.split("@")
    return getattr(imp(mod), name)


def make_batch(config: dict, seed: int) -> dict[str, np.ndarray]:
    """inputs, labels (about 20% ignored: -100), puzzle_identifiers (numpy, int32)."""
    rng = np.random.default_rng(seed)
    b, s = config["batch_size"], config["seq_len"]
    labels = rng.integers(1, config["vocab_size"], (b, s)).astype(np.int32)
    labels[rng.random((b, s)) < 0.2] = -100
    return {
        "inputs": rng.integers(0, config["vocab_size"], (b, s)).astype(np.int32),
        "labels": labels,
        "puzzle_identifiers": rng.integers(0, config["num_puzzle_identifiers"], (b,)).astype(
            np.int32
        ),
    }


def initial_state_dict(imp, variant: str) -> dict:
    """The float32 model as pretrain.py would checkpoint it: upstream's init (seed SEED), then the
    zero-initialised pieces made non-trivial so they are tested too (random puzzle rows, q_head
    weights 0.1 * N(0, 1), bias Q_BIAS). Keys as torch.compile(loss head).state_dict()."""
    import torch

    losses = imp("models.losses")
    torch.manual_seed(SEED)
    model = _cls(imp, VARIANTS[variant][0])(model_config(variant, "float32"))
    head = losses.ACTLossHead(model, LOSS)
    inner = model.inner
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        inner.puzzle_emb.weights.copy_(torch.randn(inner.puzzle_emb.weights.shape, generator=g))
        inner.q_head.weight.copy_(0.1 * torch.randn(inner.q_head.weight.shape, generator=g))
        inner.q_head.bias.copy_(torch.tensor(Q_BIAS))
    compiled = torch.compile(head)  # lazy: nothing is compiled until it is called
    return {k: v.detach().clone() for k, v in compiled.state_dict().items()}


def build_head(imp, variant: str, dtype: str, state_dict: dict):
    """Upstream's loss head holding `state_dict` (float32 values), in `dtype`."""
    import torch

    losses = imp("models.losses")
    model = _cls(imp, VARIANTS[variant][0])(model_config(variant, dtype))
    head = losses.ACTLossHead(model, LOSS)
    compiled = torch.compile(head)
    compiled.load_state_dict(state_dict)
    if dtype == "float64":
        head.double()
        pe = model.inner.puzzle_emb
        pe.local_weights = torch.zeros(
            pe.local_weights.shape, dtype=torch.float64, requires_grad=True
        )
    return head


def perturb_f32_ulp(state_dict: dict, seed: int) -> dict:
    """Every floating tensor moved by one float32 ulp, the direction drawn per element."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, t in state_dict.items():
        if not t.is_floating_point():
            out[k] = t
            continue
        t32 = t.float()
        up = torch.rand(t.shape, generator=g, dtype=torch.float64) < 0.5
        inf = torch.full_like(t32, float("inf"))
        out[k] = torch.where(up, torch.nextafter(t32, inf), torch.nextafter(t32, -inf)).to(t.dtype)
    return out


@contextlib.contextmanager
def recorded_draws(log: list):
    """Record what upstream's exploration draws from torch's global RNG (rand_like, randint_like),
    calling the real functions."""
    import torch

    rand_like, randint_like = torch.rand_like, torch.randint_like

    def rec_rand(*a, **k):
        x = rand_like(*a, **k)
        log.append(("u", x.clone()))
        return x

    def rec_randint(*a, **k):
        x = randint_like(*a, **k)
        log.append(("k", x.clone()))
        return x

    torch.rand_like, torch.randint_like = rec_rand, rec_randint
    try:
        yield
    finally:
        torch.rand_like, torch.randint_like = rand_like, randint_like


def _t(batch):
    import torch

    return {k: torch.from_numpy(v) for k, v in batch.items()}


def rollout(head, config: dict, *, train: bool) -> list[tuple[dict, dict]]:
    """Upstream ACT steps; per step (exact, floats): name -> numpy. Eval: batch SEED+1 held for
    halt_max_steps steps. Train: a new batch every step (SEED+10+step), TRAIN_STEPS steps, torch
    seeded first so every (perturbed) run draws the same exploration."""
    import torch

    head.train(train)
    first = make_batch(config, SEED + 1)
    n = TRAIN_STEPS if train else config["halt_max_steps"]
    batches = [make_batch(config, SEED + 10 + i) if train else first for i in range(n)]
    torch.manual_seed(SEED + 100)
    carry = head.initial_carry(_t(first))
    keys = ("logits", "q_halt_logits", "q_continue_logits", "target_q_continue")
    steps = []
    for batch in batches:
        draws = []
        with torch.no_grad(), recorded_draws(draws):
            carry, loss, metrics, outputs, _ = head(carry=carry, batch=_t(batch), return_keys=keys)
        exact = {"steps": carry.steps, "halted": carry.halted}
        exact.update({f"current_data.{k}": v for k, v in carry.current_data.items()})
        floats = {
            "z_H": carry.inner_carry.z_H,
            "z_L": carry.inner_carry.z_L,
            **outputs,
            "loss": loss,
        }
        floats.update({f"metrics.{k}": v for k, v in metrics.items()})
        exact.update({f"batch.{k}": v for k, v in batch.items()})
        if train:
            exact.update({f"explore_{name}": x for name, x in draws})
        steps.append(
            ({k: _np(v) for k, v in exact.items()}, {k: _np(v) for k, v in floats.items()})
        )
    return steps


def _np(v):
    if hasattr(v, "detach"):
        return v.detach().cpu().numpy()
    return np.asarray(v)


def gradients(head, config: dict) -> tuple[dict, dict]:
    """One train step from a fresh carry (batch SEED+1, torch seeded): the loss, the gradient of
    every parameter (state_dict key, `_orig_mod.` prefixed like the checkpoint) and of the gathered
    puzzle rows (`puzzle_emb.local_weights.grad`), and the exploration draws."""
    import torch

    head.train()
    head.zero_grad(set_to_none=True)
    pe = head.model.inner.puzzle_emb
    pe.local_weights.grad = None
    batch = make_batch(config, SEED + 1)
    torch.manual_seed(SEED + 200)
    draws = []
    with recorded_draws(draws):
        carry = head.initial_carry(_t(batch))
        _, loss, _, _, _ = head(carry=carry, batch=_t(batch), return_keys=())
    loss.backward()
    floats = {f"_orig_mod.{k}": p.grad for k, p in head.named_parameters()}
    floats["puzzle_rows"] = pe.local_weights.grad
    floats["loss"] = loss
    exact = {f"explore_{name}": x for name, x in draws}
    exact.update({f"batch.{k}": v for k, v in batch.items()})
    return {k: _np(v) for k, v in exact.items()}, {k: _np(v) for k, v in floats.items()}


def envelope(reference: list[tuple[dict, dict]], runs: list[list[tuple[dict, dict]]]) -> np.ndarray:
    """Per step: the largest scale-relative move of any float tensor over the perturbed runs. A run
    whose integer state differs from the reference means one ulp flipped a decision: an error."""
    env = np.zeros(len(reference))
    for run in runs:
        for i, ((ex_p, fl_p), (ex_r, fl_r)) in enumerate(zip(run, reference, strict=True)):
            for k, v in ex_r.items():
                if not np.array_equal(ex_p[k], v):
                    raise ValueError(
                        f"step {i + 1}: one float32 ulp of the weights changed {k!r}; the rollout "
                        "sits on a tie: change SEED or Q_BIAS"
                    )
            env[i] = max([env[i]] + [move(fl_p[k], v) for k, v in fl_r.items()])
    return env


def _flat(prefix: str, steps: list[tuple[dict, dict]]) -> dict:
    out = {}
    for i, (exact, floats) in enumerate(steps):
        for k, v in {**exact, **floats}.items():
            out[f"{prefix}.{i}.{k}"] = v
    return out


def generate_variant(imp, variant: str, out: Path) -> dict:
    sd = initial_state_dict(imp, variant)
    files = [save_npz(out, f"trm_{variant}_state_dict", sd).name]
    perturbed = [perturb_f32_ulp(sd, s) for s in ENVELOPE_SEEDS]
    for dtype in ("float32", "float64"):
        cfg = model_config(variant, dtype)
        arrays = {}
        for mode in ("eval", "train"):
            ref = rollout(build_head(imp, variant, dtype, sd), cfg, train=mode == "train")
            runs = [
                rollout(build_head(imp, variant, dtype, p), cfg, train=mode == "train")
                for p in perturbed
            ]
            arrays.update(_flat(mode, ref))
            arrays[f"{mode}.envelope"] = envelope(ref, runs)
        if dtype == "float64" or variant in FLOAT32_GRAD_VARIANTS:
            ref = gradients(build_head(imp, variant, dtype, sd), cfg)
            runs = [[gradients(build_head(imp, variant, dtype, p), cfg)] for p in perturbed]
            arrays.update({f"grad.{k}": v for k, v in {**ref[0], **ref[1]}.items()})
            arrays["grad.envelope"] = envelope([ref], runs)
        files.append(save_npz(out, f"trm_{variant}_{dtype}", arrays).name)
    return {"config": {d: model_config(variant, d) for d in ("float32", "float64")}, "files": files}


def upstream_bugs(imp) -> dict[str, str]:
    """Run the three upstream paths that docs/porting_trm.md lists as bugs (fixed on our side) and
    return what each raised ("ExceptionType: message"; "no error" if it ran)."""
    import torch

    losses = imp("models.losses")
    cls = _cls(imp, VARIANTS["att"][0])
    batch = _t(make_batch(BASE, SEED + 1))
    cases = {
        # the loss head passes valid_mask=, softmax_cross_entropy does not take it
        "softmax_cross_entropy": (dict(), "softmax_cross_entropy", True),
        # the second inner call returns 3 values, the ACT wrapper unpacks 5
        "no_ACT_continue=False": (dict(no_ACT_continue=False), LOSS, True),
        # no puzzle embedding, but the shapes still count puzzle_emb_len prefix rows
        "puzzle_emb_ndim=0": (dict(puzzle_emb_ndim=0), LOSS, False),
    }
    out = {}
    for name, (overrides, loss, train) in cases.items():
        torch.manual_seed(SEED)
        head = losses.ACTLossHead(cls({**BASE, "forward_dtype": "float32", **overrides}), loss)
        head.train(train)
        try:
            head(carry=head.initial_carry(batch), batch=batch, return_keys=())
            out[name] = "no error"
        except Exception as e:  # noqa: BLE001 - recording what upstream raises is the point
            out[name] = f"{type(e).__name__}: {e}"
    return out


def generate(src: Path, out: Path) -> dict:
    """Write every TRM fixture into `out` and its section of OUT/manifest.json; return it."""
    import torch

    src, out = Path(src), Path(out)
    section = {
        "upstream": "SamsungSAILMontreal/TinyRecursiveModels",
        "commit": git_commit(src),
        "torch": torch.__version__,
        # ATen's label alone does not name the kernels: "machine" below does (parity/machine.py)
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": 1,
        "numpy": np.__version__,
        "seed": SEED,
        "envelope_seeds": list(ENVELOPE_SEEDS),
        "train_steps": TRAIN_STEPS,
        "loss": LOSS,
        "q_bias": list(Q_BIAS),
        "stand_ins": STAND_IN_REASONS,
        "float64": "forward_dtype=float64 and loss_head.double(); puzzle_emb.local_weights "
        "re-made a float64 leaf. Upstream still computes rms_norm and RoPE in float32 and casts "
        "q logits (so q_halt_loss) to float32.",
        "variants": {},
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tests (tests/conftest.py): reduction order depends on it
    try:
        section["machine"] = machine.identity()  # a run with the same kernels is bit-identical
        with upstream(src) as imp:
            for variant in VARIANTS:
                section["variants"][variant] = generate_variant(imp, variant, out)
            section["upstream_bugs"] = upstream_bugs(imp)
            section["data_files"] = trm_data.generate_arc_eval(
                imp, out
            ) + trm_data.generate_puzzle_dataset(imp, out)
    finally:
        torch.set_num_threads(threads)
    write_manifest(out, {"trm": section})
    return section


if __name__ == "__main__":  # python -m parity.goldens.trm SRC OUT
    print(json.dumps(generate(Path(sys.argv[1]), Path(sys.argv[2])), indent=1))
