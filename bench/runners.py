"""The implementations a benchmark compares, each behind the same small interface.

    runner = make_runner(spec)      # spec: impl, device, seed, resolved (configs.resolve)
    info = runner.setup()           # build model + optimiser + one fixed batch on the device
    seconds, loss = runner.run(n)   # n train steps, then ONE device sync; wall time of all n
    runner.stats()                  # memory, compile count

- `jax`: the trainer's real step: `train.families.make_task` + `jit_train_step` (jax.jit with the
  state's NamedShardings on a mesh of every visible device, state donated), state created by
  `task.create_state()` directly in its shards, the batch placed by `task.to_global`.
- `torch_eager` / `torch_compile`: our PyTorch references (parity/gpt_torch.py, parity/trm_torch/)
  with the same optimiser work as the JAX step: nanoGPT's loop body for GPT (lr from get_lr,
  AdamW over decay/no-decay groups, clip_grad_norm_ 1.0); upstream's train_batch for TRM
  (SignSGD on the puzzle rows, then AdamATan2, then the EMA). `torch_compile` wraps the model
  in torch.compile, as nanoGPT's train.py and upstream's pretrain.py do (optimiser stays eager).

Every side steps on the same batch from `make_batch`: the data set's own (or one with its token
statistics), so the benchmark sees what the trainer sees.
"""

from __future__ import annotations

import os
import time

import numpy as np

# Sudoku-Extreme's 1k training puzzles: 55,760 of their 81,000 cells are blank (ids 1)
SUDOKU_EXTREME_BLANKS = 0.688
TOKENS = ("data", "uniform")


def make_batch(rc: dict, seed: int, tokens: str = "data") -> tuple[dict[str, np.ndarray], str]:
    """One fixed batch, identical for every implementation (nanoGPT bench.py's fixed-batch mode),
    and where it came from. `rc` is a resolved config (bench.configs.resolve).

    tokens="data" (the default): what the trainer would see. The data set's own train split when
    it is on disk (TRM: the trainer's first batch from data.puzzle_source; GPT: random windows of
    train.bin, as nanoGPT's get_batch), otherwise a generator with its token statistics (Sudoku:
    random solved grids with the data set's share of blank cells; text: Zipf-distributed ids).
    tokens="uniform": every id equally likely, which hides what a skewed batch costs
    (docs/benchmarks.md, "A benchmark fed uniform tokens hides a contended scatter")."""
    if tokens not in TOKENS:
        raise ValueError(f"bench: tokens={tokens!r}: expected one of {TOKENS}")
    rng = np.random.default_rng(seed)
    if rc["family"] == "gpt":
        data, source = _gpt_tokens(rc, rng, tokens)
        return {"x": data[:, :-1].astype(np.int64), "y": data[:, 1:].astype(np.int64)}, source
    B, S, V = rc["batch_size"], rc["model"]["seq_len"], rc["model"]["vocab_size"]
    n_ids = rc["model"].get("num_puzzle_identifiers", 1)
    data_cfg = rc["trainer_cfg"].get("data") or {}
    path = data_cfg.get("path") or ""
    if tokens == "data" and os.path.isfile(os.path.join(path, "train", "dataset.json")):
        from data.puzzle_source import PuzzleTrainDataset

        # as the trainer draws it (train/families/trm/task.py train_iterator)
        ds = PuzzleTrainDataset(path, global_batch_size=B, seed=seed, process_index=0,
                                process_count=1,
                                epochs_per_iter=int(data_cfg.get("eval_interval_epochs")
                                                    or data_cfg.get("epochs")
                                                    or 1))  # fmt: skip
        return ds.make_batch(0, 0), f"train split of {path} (the trainer's first batch)"
    if tokens == "data" and (S, V) == (81, 11):
        from data.sudoku_solver import solved_grids

        blanks = _sudoku_blank_share(rc)
        labels = solved_grids(B, rng).astype(np.int32) + 1  # 2..10 = digits
        inputs = np.where(rng.random((B, S)) < blanks, 1, labels)  # 1 = blank
        ids = rng.integers(0, n_ids, size=(B,))
        source = f"generated Sudoku grids, {blanks:.3f} of cells blank (no data set on disk)"
    else:
        # Sudoku-like ids: 1 = blank, 2..V-1 = digits; labels are the full solution (all digits).
        inputs = rng.integers(1, V, size=(B, S))
        labels = rng.integers(2, V, size=(B, S))
        ids = rng.integers(0, n_ids, size=(B,))
        source = "uniform tokens" + ("" if tokens == "uniform" else " (no data set, no generator)")
    batch = {"inputs": inputs, "labels": labels, "puzzle_identifiers": ids}
    return {k: v.astype(np.int32) for k, v in batch.items()}, source


def _sudoku_blank_share(rc: dict) -> float:
    """The blank share of the config's Sudoku data: `blanks=K` of its generated grids
    (data.build_args, e.g. trm_sudoku_tiny), else Sudoku-Extreme's."""
    for arg in (rc["trainer_cfg"].get("data") or {}).get("build_args") or ():
        key, _, value = str(arg).partition("=")
        if key == "blanks":
            return int(value) / 81
    return SUDOKU_EXTREME_BLANKS


def _gpt_tokens(rc: dict, rng, tokens: str) -> tuple[np.ndarray, str]:
    B, T, V = rc["batch_size"], rc["model"]["block_size"], rc["model"]["vocab_size"]
    path = os.path.join((rc["trainer_cfg"].get("data") or {}).get("path") or "", "train.bin")
    if tokens == "data" and os.path.isfile(path):
        data = np.memmap(path, dtype=np.uint16, mode="r")
        starts = rng.integers(0, len(data) - T - 1, size=B)
        return np.stack([data[i : i + T + 1] for i in starts]), f"random windows of {path}"
    if tokens == "data":
        # natural-language token frequencies fall off about as 1/rank (Zipf's law)
        ranks = np.arange(1, V + 1)
        p = 1.0 / ranks
        ids = rng.choice(V, size=(B, T + 1), p=p / p.sum())
        return rng.permutation(V)[ids], "Zipf(1) token ids (no train.bin on disk)"
    return rng.integers(0, V, size=(B, T + 1)), "uniform tokens"


def place_batch(task, batch: dict) -> dict:
    """A numpy batch -> the trainer task's global arrays, the way the trainer feeds its step
    (GPT: its [accumulation, batch, block] micro-batch layout first; then `task.to_global`)."""
    return task.to_global(task.local_batch(batch))


def make_runner(spec: dict):
    """`spec`: impl, device, seed and `resolved` (bench.configs.resolve output)."""
    rc = spec["resolved"]
    impl = spec["impl"]
    if impl == "jax":
        return JaxRunner(rc, spec)
    if impl in ("torch_eager", "torch_compile"):
        cls = TorchGPTRunner if rc["family"] == "gpt" else TorchTRMRunner
        return cls(rc, spec, compile=impl == "torch_compile")
    raise ValueError(f"bench: unknown impl {impl!r}")


# ----------------------------------------------------------------------------------------------
# JAX: the trainer's step


class _CompileCounter:
    """Counts XLA backend compilations in this process (jax.monitoring duration events)."""

    count = 0
    _registered = False

    @classmethod
    def install(cls):
        if cls._registered:
            return
        import jax

        def listener(event, duration_secs, **kwargs):
            if event == "/jax/core/compile/backend_compile_duration":
                cls.count += 1

        jax.monitoring.register_event_duration_secs_listener(listener)
        cls._registered = True


def _loss_of(metrics: dict) -> float:
    """Loss of a step's metrics. TRM: upstream's lm + 0.5 (q_halt + q_continue); the trainer's
    TRM metrics are already per example (divided by the global batch), like the torch side's."""
    if "loss" in metrics:
        return float(np.asarray(metrics["loss"]))
    lm, qh = (float(np.asarray(metrics[k])) for k in ("lm_loss", "q_halt_loss"))
    qc = float(np.asarray(metrics.get("q_continue_loss", 0.0)))
    return lm + 0.5 * (qh + qc)


def _jax_attention_impl(mcfg) -> str:
    """What the JAX model's attention runs here in training: explicit | xla | cudnn | none.

    `attention_impl: auto` resolves per backend/dtype/shape at trace time
    (models.attention.resolve_attention_impl); the record says which path the timed step took."""
    from models.attention import resolve_attention_impl

    if getattr(mcfg, "n_head", None):  # GPTConfig
        return resolve_attention_impl(
            mcfg.attention_impl,
            mcfg.compute_dtype,
            mcfg.n_embd // mcfg.n_head,
            dropout_active=mcfg.dropout > 0,
        )
    if mcfg.block_mlp_t:
        return "none (mlp_t: token-mixing MLP)"
    import jax.numpy as jnp

    return resolve_attention_impl(mcfg.attention_impl, jnp.dtype(mcfg.forward_dtype), mcfg.head_dim)


class JaxRunner:
    def __init__(self, cfg, spec):
        self.cfg, self.spec = cfg, spec

    def setup(self) -> dict:
        import jax

        from train import mesh as mesh_lib
        from train.families import make_task
        from train.jit import jit_train_step

        _CompileCounter.install()
        from omegaconf import OmegaConf

        self.tcfg = OmegaConf.create(self.cfg["trainer_cfg"])
        self.mesh = mesh_lib.make_mesh(self.tcfg.mesh)
        # as train.trainer does: x64 on for upstream's float64 loss
        self.task = make_task(self.tcfg, self.mesh, need_data=False)
        self.step_fn = jit_train_step(self.task)
        self.state = self.task.create_state()
        batch, self.batch_source = make_batch(
            self.cfg, self.spec["seed"], self.spec.get("tokens", "data")
        )
        self.batch = place_batch(self.task, batch)
        jax.block_until_ready((self.state, self.batch))
        dev = jax.devices()[0]
        return {
            "framework": "jax " + jax.__version__,
            "device": f"{dev.platform}:{dev.device_kind}",
            "num_devices": jax.device_count(),
            "mesh": dict(self.mesh.shape),
            "step": "train.jit.jit_train_step(train.families.make_task(cfg, mesh)) "
            "(jax.jit, NamedShardings, donate_argnums=0)",
            "task_flops_per_step": float(self.task.flops_per_step),
            "attention_impl": _jax_attention_impl(self.task.model_cfg),
            "batch_source": self.batch_source,
            # params + optimiser state (+ TRM carry), in elements
            "state_elements": int(
                sum(x.size for x in jax.tree.leaves(self.state) if hasattr(x, "size"))
            ),
        }

    def run(self, n: int):
        import jax

        t0 = time.perf_counter()
        metrics = None
        for _ in range(n):
            self.state, metrics = self.step_fn(self.state, self.batch)
        jax.block_until_ready((self.state, metrics))
        dt = time.perf_counter() - t0
        return dt, _loss_of(metrics)

    def stats(self) -> dict:
        import jax

        out = {"compiles": _CompileCounter.count}
        dev = jax.devices()[0]
        if dev.platform != "cpu":
            ms = dev.memory_stats() or {}
            out["device_peak_bytes"] = ms.get("peak_bytes_in_use")
        return out


# ----------------------------------------------------------------------------------------------
# PyTorch: shared helpers


def _torch_setup(device: str):
    import torch

    from bench.machine import cpu_count

    if device == "gpu":
        torch.backends.cuda.matmul.allow_tf32 = True  # nanoGPT train.py sets both
        torch.backends.cudnn.allow_tf32 = True
        return torch.device("cuda")
    torch.set_num_threads(cpu_count())  # what JAX's CPU client uses too: every core
    return torch.device("cpu")


def _torch_sync(dev):
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()


def _release_cached(dev) -> None:
    """Give the CUDA caching allocator's free blocks back after a timed run (untimed). The
    implementations of a benchmark are processes alive at once on one GPU, and torch keeps its
    peak reserved: on an H100 trm_sudoku's eager worker (41 GB) beside the JAX one (30 GB) left
    torch.compile's no room (docs/benchmarks.md, "Workers share one GPU's memory"). The next
    run's first step allocates again, inside its timing: a few ms against rounds of seconds."""
    import torch

    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _torch_stats(dev) -> dict:
    import torch

    out = {}
    if dev.type == "cuda":
        out["device_peak_bytes"] = torch.cuda.max_memory_allocated()
    try:
        from torch._dynamo.utils import counters

        out["compiles"] = int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - dynamo internals move between versions
        out["compiles"] = None
    return out


def _torch_info(dev, model, compile: bool) -> dict:
    import torch

    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {
        "framework": "torch " + torch.__version__,
        "device": f"{dev.type}:{name}",
        "torch_threads": torch.get_num_threads(),
        "compiled": compile,
        "param_count": sum(p.numel() for p in model.parameters()),
    }


# ----------------------------------------------------------------------------------------------
# PyTorch nanoGPT


class _TorchRunner:
    """What both torch runners share: n steps between two device syncs, memory stats. A subclass
    defines `setup` and `_step` (one optimiser step, returning the loss tensor) and
    `_loss_value` (the reported loss, comparable with the JAX side's)."""

    def __init__(self, cfg, spec, compile: bool):
        self.cfg, self.spec, self.compile = cfg, spec, compile

    def run(self, n: int):
        _torch_sync(self.dev)
        t0 = time.perf_counter()
        for _ in range(n):
            loss = self._step()
        _torch_sync(self.dev)
        dt = time.perf_counter() - t0
        value = self._loss_value(loss)
        _release_cached(self.dev)
        return dt, value

    def stats(self) -> dict:
        return _torch_stats(self.dev)


class TorchGPTRunner(_TorchRunner):
    def setup(self) -> dict:
        import contextlib

        import torch

        from parity.gpt_torch import GPT, GPTConfig, get_lr

        self.dev = _torch_setup(self.spec["device"])
        torch.manual_seed(self.spec["seed"])
        self.model = GPT(GPTConfig(**self.cfg["model"])).to(self.dev)
        self.model.train()
        o = self.cfg["optim"]
        self.optimizer = self.model.configure_optimizers(
            o["weight_decay"], o["learning_rate"], (o["beta1"], o["beta2"]), self.dev.type
        )
        self.lr_kwargs = {
            k: o[k] for k in ("learning_rate", "warmup_iters", "lr_decay_iters", "min_lr")
        }
        self.get_lr = get_lr
        self.fwd = torch.compile(self.model) if self.compile else self.model
        batch, source = make_batch(self.cfg, self.spec["seed"], self.spec.get("tokens", "data"))
        self.x = torch.from_numpy(batch["x"]).to(self.dev)
        self.y = torch.from_numpy(batch["y"]).to(self.dev)
        # nanoGPT's policy: fp32 params and optimiser, matmuls autocast to the compute dtype
        if self.cfg["dtype"] in ("bfloat16", "float16"):
            dt = getattr(torch, self.cfg["dtype"])
            self.ctx = lambda: torch.amp.autocast(device_type=self.dev.type, dtype=dt)
        else:
            self.ctx = contextlib.nullcontext
        self.iter_num = 0
        return {**_torch_info(self.dev, self.model, self.compile), "batch_source": source}

    def _step(self):
        import torch

        o = self.cfg["optim"]
        lr = self.get_lr(self.iter_num, **self.lr_kwargs) if o["decay_lr"] else o["learning_rate"]
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with self.ctx():
            _, loss = self.fwd(self.x, self.y)
        loss.backward()
        if o["grad_clip"] != 0.0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), o["grad_clip"])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.iter_num += 1
        return loss

    def _loss_value(self, loss) -> float:
        return float(loss.detach().float().cpu())


# ----------------------------------------------------------------------------------------------
# PyTorch TRM


class TorchTRMRunner(_TorchRunner):
    """Upstream pretrain.py's train_batch on our PyTorch TRM: forward on the persistent carry,
    backward of loss / global_batch, SignSGD on the puzzle rows, AdamATan2, then the EMA."""

    def setup(self) -> dict:
        import torch

        from models.trm.config import TRMConfig
        from parity.trm_torch import ACTLossHead, build_model
        from parity.trm_torch.optim import AdamATan2, EMAHelper, SparseSignSGD, train_batch

        self.dev = _torch_setup(self.spec["device"])
        torch.manual_seed(self.spec["seed"])
        rc, o = self.cfg, self.cfg["optim"]
        B = rc["batch_size"]
        model_cfg = TRMConfig(**{**rc["model"], "batch_size": B})
        batch, source = make_batch(rc, self.spec["seed"], self.spec.get("tokens", "data"))
        # upstream builds everything under `with torch.device("cuda")`; so do we (the carry too)
        with torch.device(self.dev):
            self.model = ACTLossHead(build_model(model_cfg))
            self.model.train()
            self.batch = {k: torch.from_numpy(v).to(self.dev) for k, v in batch.items()}
            self.carry = self.model.initial_carry(self.batch)
        self.optimizers, self.base_lrs = [], []
        if model_cfg.puzzle_emb_ndim > 0:
            emb = self.model.model.puzzle_emb
            self.optimizers.append(
                SparseSignSGD(
                    emb.weights,
                    emb.local_weights,
                    emb.local_ids,
                    lr=o["puzzle_emb_lr"],
                    weight_decay=o["puzzle_emb_weight_decay"],
                )  # fmt: skip
            )
            self.base_lrs.append(o["puzzle_emb_lr"])
        self.optimizers.append(
            AdamATan2(
                self.model.parameters(),
                lr=o["lr"],
                betas=(o["beta1"], o["beta2"]),
                weight_decay=o["weight_decay"],
            )  # fmt: skip
        )
        self.base_lrs.append(o["lr"])
        self.ema = None
        if o.get("ema", False):
            self.ema = EMAHelper(mu=o["ema_rate"])
            self.ema.register(self.model)
        self.train_batch = train_batch
        self.fwd = torch.compile(self.model) if self.compile else self.model
        self.step_count = 0
        return {**_torch_info(self.dev, self.model, self.compile), "batch_source": source}

    def _loss_fn(self):
        self.carry, loss, metrics, _, _ = self.fwd(carry=self.carry, batch=self.batch)
        return loss, loss.detach()

    def _step(self):
        o = self.cfg["optim"]
        self.step_count += 1
        loss, _ = self.train_batch(
            self._loss_fn,
            self.optimizers,
            self.base_lrs,
            self.step_count,
            total_steps=o["total_steps"],
            warmup_steps=o["lr_warmup_steps"],
            min_ratio=o["lr_min_ratio"],
            global_batch_size=self.cfg["batch_size"],
        )
        if self.ema is not None:
            self.ema.update(self.model)
        return loss

    def _loss_value(self, loss) -> float:
        # the torch ACT loss head returns the batch sum; the trainer's metrics are per example
        return float(loss.float().cpu()) / self.cfg["batch_size"]
