"""Our own PyTorch reference for TRM's optimisation stack, written for this project from
upstream's documented behaviour (its optimiser, schedule, EMA and train_batch), not copied.

- `AdamATan2`: imoneoi/adam-atan2's update (NOT lucidrains' adam-atan2-pytorch, which has a/b
  scale factors and rejects lr = 0).
- `SparseSignSGD` / `sign_sgd_rows_`: the SignSGD of the puzzle-embedding table.
- `compute_lr`: the warm-up + cosine schedule with a floor ratio.
- `EMAHelper`: the shadow of the trainable parameters used for eval and checkpoints.
- `train_batch`: upstream's order of one training step around a loss head.

The JAX port in models/trm/optim.py and models/trm/training.py is compared to this file by
tests/test_trm_optim.py and tests/test_trm_training_parity.py.
"""

from __future__ import annotations

import copy
import math

import torch


class AdamATan2(torch.optim.Optimizer):
    """Adam with atan2 in place of m / (sqrt(v) + eps); decoupled decay applied before the moments."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.95), weight_decay: float = 0.1):
        if lr < 0:
            raise ValueError(f"AdamATan2: lr must be >= 0, got {lr}")
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    # upstream keeps t as a float32 tensor; it is exact for t < 2**24
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = float(state["step"])
                m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
                p.mul_(1 - lr * wd)
                m.lerp_(g, 1 - b1)
                v.lerp_(g * g, 1 - b2)
                bias1 = 1 - b1**t
                bias2 = 1 - b2**t
                p.sub_((lr / bias1) * torch.atan2(m, v.sqrt() / math.sqrt(bias2)))
        return None


@torch.no_grad()
def sign_sgd_rows_(weights, ids, grads, lr: float, weight_decay: float) -> None:
    """In place on `weights` [N, D]: sum the [B, D] grads of duplicate ids, then for each id present
    p <- p * (1 - lr*wd) - lr * sign(g_sum). Rows absent from `ids` are not touched."""
    unique_ids, inverse = torch.unique(ids.long(), return_inverse=True)
    grad_sum = torch.zeros(
        (unique_ids.shape[0], grads.shape[1]), dtype=grads.dtype, device=grads.device
    )
    grad_sum.scatter_add_(0, inverse[:, None].expand(-1, grads.shape[1]), grads)
    rows = weights[unique_ids]
    rows.mul_(1 - lr * weight_decay).add_(torch.sign(grad_sum).to(rows.dtype), alpha=-lr)
    weights[unique_ids] = rows


class SparseSignSGD(torch.optim.Optimizer):
    """SignSGD over a puzzle table held as buffers, the way upstream's sparse embedding holds it:
    `weights` [N, D] (the table), `local_weights` [B, D] (the gathered rows, a leaf that receives
    the gradient) and `local_ids` [B]. In a torch.distributed run upstream all-gathers the local
    ids and grads first; this single-process reference does not need to."""

    def __init__(self, weights, local_weights, local_ids, lr: float = 1e-2, weight_decay=0.1):
        super().__init__([local_weights], dict(lr=lr, weight_decay=weight_decay))
        self.weights = weights
        self.local_weights = local_weights
        self.local_ids = local_ids

    @torch.no_grad()
    def step(self, closure=None):
        group = self.param_groups[0]
        grad = self.local_weights.grad
        if grad is None:
            return None
        sign_sgd_rows_(self.weights, self.local_ids, grad, group["lr"], group["weight_decay"])
        return None


def compute_lr(
    base_lr: float, step: int, warmup_steps: int, total_steps: int, min_ratio: float = 1.0
) -> float:
    """Learning rate at update `step` (counted from 1): linear warm-up, then a cosine from base_lr
    down to min_ratio * base_lr at total_steps."""
    if step < warmup_steps:
        return base_lr * float(step) / float(max(1, warmup_steps))
    progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
    return base_lr * (
        min_ratio + max(0.0, (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
    )


class EMAHelper:
    """Shadow copies of the parameters that require grad; buffers are never averaged."""

    def __init__(self, mu: float = 0.999):
        self.mu = mu
        self.shadow: dict[str, torch.Tensor] = {}

    def register(self, module: torch.nn.Module) -> None:
        for name, p in module.named_parameters():
            if p.requires_grad:
                self.shadow[name] = p.data.clone()

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        for name, p in module.named_parameters():
            if p.requires_grad:
                self.shadow[name] = (1.0 - self.mu) * p.data + self.mu * self.shadow[name]

    @torch.no_grad()
    def ema_copy(self, module: torch.nn.Module) -> torch.nn.Module:
        """Deep copy with the shadow written into the parameters (buffers keep live values)."""
        eval_module = copy.deepcopy(module)
        for name, p in eval_module.named_parameters():
            if name in self.shadow:
                p.data.copy_(self.shadow[name])
        return eval_module


def train_batch(
    loss_fn,
    optimizers,
    base_lrs,
    step: int,
    *,
    total_steps: int,
    warmup_steps: int,
    min_ratio: float,
    global_batch_size: int,
):
    """Upstream's train_batch order around a loss closure.

    `loss_fn()` runs the forward (and stores the new carry itself) and returns (loss, extra).
    `step` is the counter AFTER its increment. Returns (extra, lrs) or (None, None) when
    step > total_steps (no update; the caller still updates the EMA, as upstream does).
    Optimizers run in the given order (upstream: SignSGD first, then AdamATan2), each with its
    own lr from the schedule; no clipping, no accumulation.
    """
    if step > total_steps:
        return None, None
    loss, extra = loss_fn()
    ((1.0 / global_batch_size) * loss).backward()
    lrs = []
    for opt, base_lr in zip(optimizers, base_lrs):
        lr = compute_lr(base_lr, step, warmup_steps, total_steps, min_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        opt.zero_grad()
        lrs.append(lr)
    return extra, lrs
