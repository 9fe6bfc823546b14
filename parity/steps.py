"""K optimizer steps on both sides: torch.optim and the optax transformation that computes the same
update, and a check that the port trains like the reference.

| torch.optim | optax |
|---|---|
| SGD(lr, momentum, weight_decay) | chain(add_decayed_weights(wd), sgd(lr, momentum)) |
| Adam(lr, betas, eps, weight_decay) | chain(add_decayed_weights(wd), adam(lr, b1, b2, eps)) |
| AdamW(lr, betas, eps, weight_decay) | adamw(lr, b1, b2, eps, weight_decay) |

torch's Adam adds weight decay to the gradient (L2), AdamW shrinks the weights; optax spells
the first as a chain and the second as `adamw` (its decay uses the weights before the step, as
torch does). Each step minimises the seeded cotangent loss of parity.capture on the same inputs,
in train mode on both sides (dropout must be off: the two sides cannot share masks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from parity.capture import nnx_cotangent_loss, nnx_state, split_static, torch_cotangent_loss
from parity.check import Report, Row, compare_leaves
from parity.compare import FLOAT32, FLOAT64, Tolerance
from parity.keymap import KeyMap, build_keymap, describe_torch
from parity.state_dict import to_numpy


@dataclasses.dataclass(frozen=True)
class SGD:
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0

    def torch(self, params):
        import torch

        return torch.optim.SGD(
            params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )

    def optax(self):
        import optax

        return optax.chain(
            optax.add_decayed_weights(self.weight_decay),
            optax.sgd(self.lr, momentum=self.momentum or None),
        )


@dataclasses.dataclass(frozen=True)
class Adam:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def torch(self, params):
        import torch

        return torch.optim.Adam(
            params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay
        )

    def optax(self):
        import optax

        return optax.chain(
            optax.add_decayed_weights(self.weight_decay),
            optax.adam(self.lr, b1=self.betas[0], b2=self.betas[1], eps=self.eps),
        )


@dataclasses.dataclass(frozen=True)
class AdamW:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2

    def torch(self, params):
        import torch

        return torch.optim.AdamW(
            params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay
        )

    def optax(self):
        import optax

        return optax.adamw(
            self.lr,
            b1=self.betas[0],
            b2=self.betas[1],
            eps=self.eps,
            weight_decay=self.weight_decay,
        )


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def optimizer_from_json(d: dict):
    """{"name": "adam", "lr": ...} (as `optimizer_to_json` writes) -> the optimizer."""
    d = dict(d)
    cls = OPTIMIZERS[d.pop("name")]
    if "betas" in d:
        d["betas"] = tuple(d["betas"])
    return cls(**d)


def optimizer_to_json(opt) -> dict:
    name = next(k for k, v in OPTIMIZERS.items() if isinstance(opt, v))
    return {"name": name, **dataclasses.asdict(opt)}


def torch_steps(module, args: Sequence, opt, steps: int, *, seed: int = 0) -> list[tuple]:
    """`steps` steps of the torch module in train mode -> per step (loss, state_dict after)."""
    module.train()
    optimizer = opt.torch(module.parameters())
    out = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = torch_cotangent_loss(module(*args), seed)
        loss.backward()
        optimizer.step()
        state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        out.append((loss.detach(), state))
    return out


def nnx_steps(model, args: Sequence, opt, steps: int, *, seed: int = 0) -> list[tuple]:
    """The same steps of the NNX port (one jitted step, nnx.Optimizer over nnx.Param; other
    variables such as BatchNorm statistics leave the step with the model) -> per step
    (loss, every variable by path tuple after the step)."""
    from flax import nnx

    model.train()
    optimizer = nnx.Optimizer(model, opt.optax(), wrt=nnx.Param)
    arrays, merge = split_static(tuple(args))

    @nnx.jit
    def step(model, optimizer, arrays):
        def loss_fn(model):
            return nnx_cotangent_loss(model(*merge(arrays)), seed)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    return [(step(model, optimizer, arrays), nnx_state(model)) for _ in range(steps)]


def compare_steps(
    module,
    port,
    args: Sequence,
    opt,
    *,
    steps: int = 3,
    tol: Tolerance | None = None,
    keymap: KeyMap | None = None,
    envelope_seeds: Sequence[int] = (),
    seed: int = 0,
) -> Report:
    """Train the torch module and its port `steps` steps each with `opt` (see the table above);
    one row per step for the loss and per state_dict tensor after the step. The bound is
    FLOAT64 for float64 weights, else FLOAT32, unless `tol` is given. With `envelope_seeds`,
    each tensor may also differ by ENVELOPE_FACTOR x how far torch's own run moves when every
    weight moves by one ulp (one run per seed; parity/envelope.py): what Adam makes of the
    round-off in an exactly-zero gradient (docs/porting_your_model.md, "Adam turns a zero
    gradient's round-off into a step")."""
    import jax.numpy as jnp
    import torch

    from parity.envelope import perturbed_copies, widened

    km = keymap or build_keymap(describe_torch(module), port).check()
    if tol is None:
        tol = FLOAT64 if next(module.parameters()).dtype == torch.float64 else FLOAT32
    jargs = tuple(jnp.asarray(a.numpy()) if isinstance(a, torch.Tensor) else a for a in args)
    perturbed = list(perturbed_copies(module, envelope_seeds))
    ref = torch_steps(module, args, opt, steps, seed=seed)
    env = _steps_envelope(ref, [torch_steps(m, args, opt, steps, seed=seed) for m in perturbed])
    mine = nnx_steps(port, jargs, opt, steps, seed=seed)
    port_steps = [(np.asarray(loss), km.to_torch(s)) for loss, s in mine]
    return steps_report(port_steps, ref, by_step(widened(tol, env)))


def _steps_envelope(ref: list[tuple], runs: list[list[tuple]]) -> dict[tuple, float]:
    """Per (step, "loss") and (step, state_dict key): how far the one-ulp runs moved it."""
    from parity.envelope import largest_moves

    return largest_moves(_by_step(ref), [_by_step(run) for run in runs])


def _by_step(history: list[tuple]) -> dict[tuple, object]:
    out: dict[tuple, object] = {}
    for t, (loss, state) in enumerate(history, 1):
        out[t, "loss"] = to_numpy(loss)
        out.update({(t, k): to_numpy(v) for k, v in state.items() if v.is_floating_point()})
    return out


def _everywhere(tol: Tolerance):
    def tolerance_for(t: int, key: str) -> Tolerance:
        return tol

    return tolerance_for


def by_step(tolerance_for):
    """A tolerance_for over (t, key) pairs (parity.envelope.widened) as steps_report's (t, key)."""

    def for_step(t: int, key: str) -> Tolerance:
        return tolerance_for((t, key))

    return for_step


def steps_report(port: list[tuple], reference: list[tuple], tolerance_for) -> Report:
    """Rows `step t loss` and `step t <key>` (in the reference's key order) for each step;
    `tolerance_for(t, key)` (key "loss" for the loss) gives each row's bound, or a Tolerance
    for all."""
    if isinstance(tolerance_for, Tolerance):
        tolerance_for = _everywhere(tolerance_for)
    rows = []
    for t, ((p_loss, p_state), (r_loss, r_state)) in enumerate(zip(port, reference), 1):
        label = f"step {t} loss"
        ok, c, _, note = compare_leaves(label, [p_loss], [r_loss], tolerance_for(t, "loss"))
        rows.append(Row("steps", label, "", ok, c, "", None, note))
        for key, expected in r_state.items():
            label, module = f"step {t} {key}", key.rpartition(".")[0]
            if key not in p_state:
                rows.append(Row("steps", label, module, None, note="not in the port"))
                continue
            ok, c, _, note = compare_leaves(
                label, [p_state[key]], [expected], tolerance_for(t, key)
            )
            rows.append(Row("steps", label, module, ok, c, "", None, note))
    return Report(rows)
