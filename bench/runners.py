"""The implementations a benchmark compares, behind one interface: `make_runner(spec)`, then
`setup()` (model, optimiser, one fixed batch on the device), `run(n)` (n train steps and ONE
device sync -> seconds, loss), `evaluate()` and `stats()` (memory, compile count).

- `jax`: the trainer's real step: `train.families.make_task` + `jit_train_step` (jax.jit with the
  state's NamedShardings on a mesh of every visible device, state donated), the batch placed by
  `task.to_global`.
- `torch_eager` / `torch_compile`: our PyTorch references (parity/gpt_torch.py, parity/trm_torch/)
  doing the same optimiser work: nanoGPT's loop body for GPT (lr from get_lr, AdamW over the
  decay/no-decay groups, clip_grad_norm_ 1.0), upstream's train_batch for TRM (SignSGD on the
  puzzle rows, AdamATan2, the EMA); `torch_compile` wraps the model in torch.compile, as
  nanoGPT's train.py and upstream's pretrain.py do.

Every side steps on the same batch from `make_batch`. With `spec["data_dir"]` (`python -m bench
ttq`) each step takes the next batch of one seeded stream instead (bench.ttq.make_data: the same
draws on every side), and `evaluate` sums the eval metrics over its fixed eval batches.
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
    data_cfg = rc["trainer_cfg"].get("data") or {}
    path = data_cfg.get("path") or ""
    if rc["family"] == "gpt":
        data, source = _gpt_tokens(rc, rng, tokens, os.path.join(path, "train.bin"))
        return {"x": data[:, :-1].astype(np.int64), "y": data[:, 1:].astype(np.int64)}, source
    B, S, V = rc["batch_size"], rc["model"]["seq_len"], rc["model"]["vocab_size"]
    ids = rng.integers(0, rc["model"].get("num_puzzle_identifiers", 1), size=(B,))
    if tokens == "data" and os.path.isfile(os.path.join(path, "train", "dataset.json")):
        from data.puzzle_source import PuzzleTrainDataset

        # as the trainer draws it (train/families/trm/task.py train_iterator)
        epochs = int(data_cfg.get("eval_interval_epochs") or data_cfg.get("epochs") or 1)
        ds = PuzzleTrainDataset(path, global_batch_size=B, seed=seed, process_index=0,
                                process_count=1, epochs_per_iter=epochs)  # fmt: skip
        return ds.make_batch(0, 0), f"train split of {path} (the trainer's first batch)"
    if tokens == "data" and (S, V) == (81, 11):
        from data.sudoku_solver import solved_grids

        blanks = _sudoku_blank_share(data_cfg)
        labels = solved_grids(B, rng).astype(np.int32) + 1  # 2..10 = digits
        inputs = np.where(rng.random((B, S)) < blanks, 1, labels)  # 1 = blank
        source = f"generated Sudoku grids, {blanks:.3f} of cells blank (no data set on disk)"
    else:
        # Sudoku-like ids: 1 = blank, 2..V-1 = digits; labels are the full solution (all digits)
        inputs, labels = rng.integers(1, V, size=(B, S)), rng.integers(2, V, size=(B, S))
        source = "uniform tokens" + ("" if tokens == "uniform" else " (no data set, no generator)")
    batch = {"inputs": inputs, "labels": labels, "puzzle_identifiers": ids}
    return {k: v.astype(np.int32) for k, v in batch.items()}, source


def _sudoku_blank_share(data_cfg: dict) -> float:
    """`blanks=K` of the config's generated grids (data.build_args, e.g. trm_sudoku_tiny), else
    Sudoku-Extreme's share."""
    for arg in data_cfg.get("build_args") or ():
        key, _, value = str(arg).partition("=")
        if key == "blanks":
            return int(value) / 81
    return SUDOKU_EXTREME_BLANKS


def _gpt_tokens(rc: dict, rng, tokens: str, path: str) -> tuple[np.ndarray, str]:
    B, T, V = rc["batch_size"], rc["model"]["block_size"], rc["model"]["vocab_size"]
    if tokens == "data" and os.path.isfile(path):
        data = np.memmap(path, dtype=np.uint16, mode="r")
        starts = rng.integers(0, len(data) - T - 1, size=B)
        return np.stack([data[i : i + T + 1] for i in starts]), f"random windows of {path}"
    if tokens == "data":  # natural-language token frequencies fall off about as 1/rank (Zipf)
        p = 1.0 / np.arange(1, V + 1)
        ids = rng.choice(V, size=(B, T + 1), p=p / p.sum())
        return rng.permutation(V)[ids], "Zipf(1) token ids (no train.bin on disk)"
    return rng.integers(0, V, size=(B, T + 1)), "uniform tokens"


# ----------------------------------------------------------------------------------------------
# The data streams of `python -m bench ttq` (numpy only: the same draws in every worker)


class GPTData:
    """nanoGPT get_batch: random windows of block_size+1 tokens from a uint16 token file."""

    def __init__(self, data_dir: str, block_size: int, batch_size: int, seed: int, eval_iters: int):
        self.train = np.memmap(os.path.join(data_dir, "train.bin"), dtype=np.uint16, mode="r")
        val = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r")
        self.T, self.B = block_size, batch_size
        self.rng = np.random.default_rng(seed)
        eval_rng = np.random.default_rng(seed + 1)
        self.eval_batches = [self._window(val, eval_rng) for _ in range(eval_iters)]

    def _window(self, data, rng):
        ix = rng.integers(0, len(data) - self.T - 1, size=self.B)
        x = np.stack([data[i : i + self.T + 1] for i in ix]).astype(np.int64)
        return {"x": np.ascontiguousarray(x[:, :-1]), "y": np.ascontiguousarray(x[:, 1:])}

    def next(self):
        return self._window(self.train, self.rng)


class PuzzleData:
    """Random training rows (with replacement) and a fixed test slice of an upstream data set."""

    def __init__(self, data_dir: str, batch_size: int, seed: int, eval_examples: int):
        from data.puzzle_format import load_split

        self.B = batch_size
        self.rng = np.random.default_rng(seed)
        self.train = self._flatten(load_split(data_dir, "train"))
        has_test = os.path.exists(os.path.join(data_dir, "test", "dataset.json"))
        test = self._flatten(load_split(data_dir, "test" if has_test else "train"))
        n = min(eval_examples, len(test["inputs"]))
        n -= n % batch_size if n >= batch_size else 0
        self.eval_batches = []
        for s in range(0, max(n, 1), batch_size):
            rows = np.arange(s, s + batch_size) % len(test["inputs"])
            self.eval_batches.append({k: v[rows] for k, v in test.items()})

    @staticmethod
    def _flatten(ps):
        arr = ps.sets["all"]
        puzzle = np.searchsorted(arr.puzzle_indices, np.arange(len(arr.inputs)), "right") - 1
        return {"inputs": np.asarray(arr.inputs, np.int32),
                "labels": np.asarray(arr.labels, np.int32),
                "puzzle_identifiers": arr.puzzle_identifiers[puzzle].astype(np.int32)}  # fmt: skip

    def next(self):
        rows = self.rng.integers(0, len(self.train["inputs"]), size=self.B)
        return {k: v[rows] for k, v in self.train.items()}


def make_data(rc: dict, spec: dict):
    if rc["family"] == "gpt":
        return GPTData(spec["data_dir"], rc["model"]["block_size"], rc["batch_size"],
                       spec["seed"], spec["eval_iters"])  # fmt: skip
    return PuzzleData(spec["data_dir"], rc["batch_size"], spec["seed"], spec["eval_examples"])


def place_batch(task, batch: dict) -> dict:
    """A numpy batch -> the trainer task's global arrays, the way the trainer feeds its step
    (GPT: its [accumulation, batch, block] micro-batch layout first; then `task.to_global`)."""
    return task.to_global(task.local_batch(batch))


def make_runner(spec: dict):
    """`spec`: impl, device, seed and `resolved` (bench.configs.resolve output)."""
    rc, impl = spec["resolved"], spec["impl"]
    if impl == "jax":
        return JaxRunner(rc, spec)
    if impl in ("torch_eager", "torch_compile"):
        cls = TorchGPTRunner if rc["family"] == "gpt" else TorchTRMRunner
        return cls(rc, spec, compile=impl == "torch_compile")
    raise ValueError(f"bench: unknown impl {impl!r}")


class _Runner:
    """What every runner shares: the resolved config, its spec and the optional data stream."""

    def __init__(self, cfg, spec, compile: bool = False):
        self.cfg, self.spec, self.compile = cfg, spec, compile
        self.data = None

    def _stream(self):
        if self.spec.get("data_dir"):
            self.data = make_data(self.cfg, self.spec)
        return make_batch(self.cfg, self.spec["seed"], self.spec.get("tokens", "data"))


# ----------------------------------------------------------------------------------------------
# JAX: the trainer's step


_COMPILES: list[float] = []  # the XLA backend compilations of this process, once counting


def _count_compiles() -> None:
    import jax

    def seen(event: str, secs: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            _COMPILES.append(secs)

    if not getattr(_count_compiles, "counting", False):
        jax.monitoring.register_event_duration_secs_listener(seen)
        _count_compiles.counting = True


def _loss_of(metrics: dict) -> float:
    """Loss of a step's metrics. TRM: upstream's lm + 0.5 (q_halt + q_continue); the trainer's
    TRM metrics are already per example (divided by the global batch), like the torch side's."""
    if "loss" in metrics:
        return float(np.asarray(metrics["loss"]))
    lm, qh = (float(np.asarray(metrics[k])) for k in ("lm_loss", "q_halt_loss"))
    return lm + 0.5 * (qh + float(np.asarray(metrics.get("q_continue_loss", 0.0))))


def _jax_attention_impl(mcfg) -> str:
    """What the JAX model's attention runs here in training: explicit | xla | cudnn | none
    (`attention_impl: auto` resolves per backend, dtype and shape at trace time)."""
    from models.attention import resolve_attention_impl

    if getattr(mcfg, "n_head", None):  # GPTConfig
        return resolve_attention_impl(mcfg.attention_impl, mcfg.compute_dtype,
                                      mcfg.n_embd // mcfg.n_head, dropout_active=mcfg.dropout > 0)  # fmt: skip
    if mcfg.block_mlp_t:
        return "none (mlp_t: token-mixing MLP)"
    import jax.numpy as jnp

    return resolve_attention_impl(mcfg.attention_impl, jnp.dtype(mcfg.forward_dtype), mcfg.head_dim)


class JaxRunner(_Runner):
    def setup(self) -> dict:
        import jax
        from omegaconf import OmegaConf

        from train import mesh as mesh_lib
        from train.families import make_task
        from train.jit import jit_train_step

        _count_compiles()
        self.tcfg = OmegaConf.create(self.cfg["trainer_cfg"])
        self.mesh = mesh_lib.make_mesh(self.tcfg.mesh)
        self.task = make_task(self.tcfg, self.mesh, need_data=False)  # x64 for the float64 loss
        self.step_fn = jit_train_step(self.task)
        self.state = self.task.create_state()
        batch, self.batch_source = self._stream()
        self.batch = place_batch(self.task, batch)
        self._eval_fn = None
        jax.block_until_ready((self.state, self.batch))
        dev = jax.devices()[0]
        if self.spec.get("peak_flops"):  # MFU's peak, before any other worker starts
            from bench.machine import cpu_count
            from train.flops import peak_flops

            where = f"preset for {dev.device_kind}" if dev.platform != "cpu" else (
                f"measured: best fp32 1024^3 matmul through XLA on {cpu_count()} core(s)")  # fmt: skip
            self.peak = (peak_flops(dev), where)
        return {"peak_flops": getattr(self, "peak", None), "framework": "jax " + jax.__version__,
                "device": f"{dev.platform}:{dev.device_kind}", "num_devices": jax.device_count(),
                "mesh": dict(self.mesh.shape), "step": "train.jit.jit_train_step(train.families"
                ".make_task(cfg, mesh)) (jax.jit, NamedShardings, donate_argnums=0)",
                "attention_impl": _jax_attention_impl(self.task.model_cfg),
                "batch_source": self.batch_source}  # fmt: skip

    def run(self, n: int):
        import jax

        t0 = time.perf_counter()
        for _ in range(n):
            if self.data is not None:
                self.batch = place_batch(self.task, self.data.next())
            self.state, metrics = self.step_fn(self.state, self.batch)
        jax.block_until_ready((self.state, metrics))
        return time.perf_counter() - t0, _loss_of(metrics)

    def evaluate(self) -> dict:
        """The trainer's own evaluation step (Task.eval_step: GPT's loss with dropout off; TRM's
        upstream evaluate, EMA weights, a fresh carry, halt_max_steps ACT steps), summed over the
        fixed eval batches; bench.ttq turns the sums into the metric."""
        import jax

        if self._eval_fn is None:
            self._eval_fn = jax.jit(self.task.eval_step)
        t0, sums = time.perf_counter(), {}
        for b in self.data.eval_batches:
            shapes = self.task.batch_shapes(len(next(iter(b.values()))))
            m = jax.device_get(self._eval_fn(self.state, self.task.to_global(b, shapes)))
            sums = {k: sums.get(k, 0.0) + float(v) for k, v in m.items()}
        return {"sums": sums, "eval_s": time.perf_counter() - t0}

    def stats(self) -> dict:
        import jax

        out = {"compiles": len(_COMPILES)}
        dev = jax.devices()[0]
        if dev.platform != "cpu":
            out["device_peak_bytes"] = (dev.memory_stats() or {}).get("peak_bytes_in_use")
        return out


# ----------------------------------------------------------------------------------------------
# PyTorch


class _TorchRunner(_Runner):
    """What both torch runners share: the device, n steps between two device syncs, memory
    stats. A subclass defines `_build` (model, optimisers, `self.fwd`), `_load` (a numpy batch
    onto the device), `_step` (one optimiser step -> the loss tensor), `_loss_value` (the
    reported loss, comparable with the JAX side's) and `evaluate`."""

    def setup(self) -> dict:
        import torch

        from bench.machine import cpu_count

        if self.spec["device"] == "gpu":
            torch.backends.cuda.matmul.allow_tf32 = True  # nanoGPT train.py sets both
            torch.backends.cudnn.allow_tf32 = True
            self.dev = torch.device("cuda")
        else:
            torch.set_num_threads(cpu_count())  # what JAX's CPU client uses too: every core
            self.dev = torch.device("cpu")
        torch.manual_seed(self.spec["seed"])
        batch, source = self._stream()
        self._build(batch)
        name = torch.cuda.get_device_name(self.dev) if self.dev.type == "cuda" else "cpu"
        return {"framework": "torch " + torch.__version__, "device": f"{self.dev.type}:{name}",
                "torch_threads": torch.get_num_threads(), "compiled": self.compile,
                "param_count": sum(p.numel() for p in self.model.parameters()),
                "batch_source": source}  # fmt: skip

    def _tensors(self, batch: dict) -> dict:
        import torch

        return {k: torch.from_numpy(v).to(self.dev) for k, v in batch.items()}

    def _sync(self):
        import torch

        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def run(self, n: int):
        import torch

        self._sync()
        t0 = time.perf_counter()
        for _ in range(n):
            if self.data is not None:
                self._load(self.data.next())
            loss = self._step()
        self._sync()
        dt = time.perf_counter() - t0
        value = self._loss_value(loss)
        if self.dev.type == "cuda":
            # The implementations are processes alive at once on one GPU and torch keeps its peak
            # reserved (docs/benchmarks.md, "Workers share one GPU's memory"): the free blocks go
            # back after a timed run, untimed; the next run's first step allocates again, timed.
            torch.cuda.empty_cache()
        return dt, value

    def stats(self) -> dict:
        import torch

        out = {}
        if self.dev.type == "cuda":
            out["device_peak_bytes"] = torch.cuda.max_memory_allocated()
        try:
            from torch._dynamo.utils import counters

            out["compiles"] = int(counters["stats"]["unique_graphs"])
        except Exception:  # noqa: BLE001 - dynamo internals move between versions
            out["compiles"] = None
        return out


class TorchGPTRunner(_TorchRunner):
    def _build(self, batch: dict) -> None:
        import contextlib

        import torch

        from parity.gpt_torch import GPT, GPTConfig, get_lr

        self.model = GPT(GPTConfig(**self.cfg["model"])).to(self.dev)
        self.model.train()
        o = self.cfg["optim"]
        self.optimizer = self.model.configure_optimizers(
            o["weight_decay"], o["learning_rate"], (o["beta1"], o["beta2"]), self.dev.type
        )
        self.get_lr = get_lr
        self.fwd = torch.compile(self.model) if self.compile else self.model
        self._load(batch)
        # nanoGPT's policy: fp32 params and optimiser, matmuls autocast to the compute dtype
        if self.cfg["dtype"] in ("bfloat16", "float16"):
            dt = getattr(torch, self.cfg["dtype"])
            self.ctx = lambda: torch.amp.autocast(device_type=self.dev.type, dtype=dt)
        else:
            self.ctx = contextlib.nullcontext
        self.iter_num = 0

    def _load(self, batch: dict) -> None:
        b = self._tensors(batch)
        self.x, self.y = b["x"], b["y"]

    def _step(self):
        import torch

        o = self.cfg["optim"]
        lr_args = {k: o[k] for k in ("learning_rate", "warmup_iters", "lr_decay_iters", "min_lr")}
        lr = self.get_lr(self.iter_num, **lr_args) if o["decay_lr"] else o["learning_rate"]
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

    def evaluate(self) -> dict:
        """nanoGPT's estimate_loss on the fixed eval batches: the mean loss, dropout off."""
        import torch

        t0, losses = time.perf_counter(), []
        self.model.eval()
        with torch.no_grad():
            for b in self.data.eval_batches:
                b = self._tensors(b)
                with self.ctx():
                    losses.append(float(self.fwd(b["x"], b["y"])[1].float().cpu()))
        self.model.train()
        sums = {"loss": float(np.sum(losses)), "count": float(len(losses))}
        return {"sums": sums, "eval_s": time.perf_counter() - t0}


class TorchTRMRunner(_TorchRunner):
    """Upstream pretrain.py's train_batch on our PyTorch TRM: forward on the persistent carry,
    backward of loss / global_batch, SignSGD on the puzzle rows, AdamATan2, then the EMA."""

    def _build(self, batch: dict) -> None:
        import torch

        from models.trm.config import TRMConfig
        from parity.trm_torch import ACTLossHead, build_model
        from parity.trm_torch.optim import AdamATan2, EMAHelper, SparseSignSGD, train_batch

        rc, o = self.cfg, self.cfg["optim"]
        model_cfg = TRMConfig(**{**rc["model"], "batch_size": rc["batch_size"]})
        # upstream builds everything under `with torch.device("cuda")`; so do we (the carry too)
        with torch.device(self.dev):
            self.model = ACTLossHead(build_model(model_cfg))
            self.model.train()
            self._load(batch)
            self.carry = self.model.initial_carry(self.batch)
        self.optimizers, self.base_lrs = [], []
        if model_cfg.puzzle_emb_ndim > 0:
            emb = self.model.model.puzzle_emb
            self.optimizers.append(SparseSignSGD(
                emb.weights, emb.local_weights, emb.local_ids, lr=o["puzzle_emb_lr"],
                weight_decay=o["puzzle_emb_weight_decay"]))  # fmt: skip
            self.base_lrs.append(o["puzzle_emb_lr"])
        self.optimizers.append(AdamATan2(self.model.parameters(), lr=o["lr"],
                                         betas=(o["beta1"], o["beta2"]),
                                         weight_decay=o["weight_decay"]))  # fmt: skip
        self.base_lrs.append(o["lr"])
        self.ema = None
        if o.get("ema", False):
            self.ema = EMAHelper(mu=o["ema_rate"])
            self.ema.register(self.model)
        self.train_batch = train_batch
        self.fwd = torch.compile(self.model) if self.compile else self.model
        self.step_count = 0

    def _load(self, batch: dict) -> None:
        self.batch = self._tensors(batch)

    def _loss_fn(self):
        self.carry, loss, metrics, _, _ = self.fwd(carry=self.carry, batch=self.batch)
        return loss, loss.detach()

    def _step(self):
        o = self.cfg["optim"]
        self.step_count += 1
        loss, _ = self.train_batch(
            self._loss_fn, self.optimizers, self.base_lrs, self.step_count,
            total_steps=o["total_steps"], warmup_steps=o["lr_warmup_steps"],
            min_ratio=o["lr_min_ratio"], global_batch_size=self.cfg["batch_size"],
        )  # fmt: skip
        if self.ema is not None:
            self.ema.update(self.model)
        return loss

    def _loss_value(self, loss) -> float:
        # the torch ACT loss head returns the batch sum; the trainer's metrics are per example
        return float(loss.float().cpu()) / self.cfg["batch_size"]

    def evaluate(self) -> dict:
        """Upstream's evaluate: the EMA weights, a fresh carry, halt_max_steps ACT steps; the
        metric sums of the last step, summed over the fixed eval batches."""
        import torch

        t0, sums = time.perf_counter(), None
        model = self.ema.ema_copy(self.model) if self.ema is not None else self.model
        model.eval()
        with torch.no_grad(), torch.device(self.dev):
            for b in self.data.eval_batches:
                batch = self._tensors(b)
                carry = model.initial_carry(batch)
                for _ in range(self.cfg["model"]["halt_max_steps"]):
                    carry, _, metrics, _, _ = model(carry=carry, batch=batch)
                m = {k: float(v) for k, v in metrics.items()}
                sums = m if sums is None else {k: sums[k] + m[k] for k in sums}
        self.model.train()
        return {"sums": sums, "eval_s": time.perf_counter() - t0}
