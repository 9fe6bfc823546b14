"""The toy family's model package (what models/<family>/ holds): a two-layer MLP classifier, its
config, its optimiser config, the train state, a pure train step, a pure eval step and the FLOP
count. Nothing here knows the trainer.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """The `model` section."""

    features: int = 8
    width: int = 16
    classes: int = 4


@dataclasses.dataclass(frozen=True)
class ToyOptimConfig:
    """The `optim` section."""

    lr: float = 0.1


class ToyModel(nnx.Module):
    def __init__(self, config: ToyConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.hidden = nnx.Linear(config.features, config.width, rngs=rngs)
        self.out = nnx.Linear(config.width, config.classes, rngs=rngs)

    def __call__(self, x_bf):
        return self.out(jax.nn.relu(self.hidden(x_bf)))


def init_train_state(model: ToyModel, config: ToyOptimConfig):
    """(graphdef, state): nnx.split of the model and its SGD optimizer."""
    return nnx.split((model, nnx.Optimizer(model, optax.sgd(config.lr), wrt=nnx.Param)))


def _loss(model: ToyModel, batch: dict):
    logits_bc = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits_bc, batch["y"]).mean()


def train_step(graphdef, state, batch: dict):
    """One SGD step, pure: (graphdef, state, batch) -> (state, {"loss", "grad_norm"})."""
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(_loss)(model, batch)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), {"loss": loss, "grad_norm": optax.tree.norm(grads)}


def eval_step(graphdef, state, batch: dict) -> dict:
    """Sums over one batch that add over batches: loss, correct predictions, count."""
    model, _ = nnx.merge(graphdef, state)
    logits_bc = model(batch["x"])
    losses_b = optax.softmax_cross_entropy_with_integer_labels(logits_bc, batch["y"])
    correct_b = jnp.argmax(logits_bc, axis=-1) == batch["y"]
    return {
        "loss": jnp.sum(losses_b),
        "correct": jnp.sum(correct_b.astype(jnp.float32)),
        "count": jnp.float32(batch["y"].shape[0]),
    }


def flops_per_step(config: ToyConfig, batch_size: int) -> int:
    """Matmul FLOPs of one step: forward 2 per multiply-add, backward twice the forward."""
    c = config
    return 3 * 2 * batch_size * (c.features * c.width + c.width * c.classes)
