"""The Tiny Recursive Model (upstream models/recursive_reasoning/trm.py) in Flax NNX.

`TRM` is the ACT wrapper (upstream TinyRecursiveReasoningModel_ACTV1); `TRMInner` is one ACT step
of recursion (upstream ..._Inner). The variants (HRM, trm_singlez, trm_hier6, the transformer
baseline) subclass `InnerBase` in hrm.py / variants.py and reuse the wrapper.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from models.trm.config import TRMConfig
from models.trm.layers import (
    CastedEmbedding,
    CastedLinear,
    CastedSparseEmbedding,
    LatentInit,
    ReasoningModule,
    _tag,
    record,
    rope_tables,
    trunc_normal,
)


@struct.dataclass
class TRMCarry:
    """Upstream's ACT carry as a pytree of arrays (jit-, shard-, donate- and checkpoint-able)."""

    inner_carry: dict  # {"z_H": [B, L, D], "z_L": [B, L, D]} (variants: their own latents)
    steps: jax.Array  # int32 [B]
    halted: jax.Array  # bool [B]
    current_data: dict  # the batch rows currently held by each slot


def _dtype(config: TRMConfig):
    if config.forward_dtype == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(
            "TRMConfig.forward_dtype='float64' needs jax x64: wrap the code in "
            "`with jax.enable_x64(True):` or set jax.config.update('jax_enable_x64', True)"
        )
    return jnp.dtype(config.forward_dtype)


class InnerBase(nnx.Module):
    """What every variant shares: token/puzzle/position embeddings, lm_head, q_head, RoPE."""

    latent_names: tuple[str, ...] = ("z_H", "z_L")
    init_names: tuple[str, ...] = ("H_init", "L_init")

    def __init__(self, config: TRMConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.forward_dtype = _dtype(config)
        self.embed_scale = math.sqrt(config.hidden_size)
        embed_init_std = 1.0 / self.embed_scale
        self.embed_tokens = CastedEmbedding(
            config.vocab_size, config.hidden_size, embed_init_std, self.forward_dtype, rngs=rngs
        )
        self.lm_head = CastedLinear(config.hidden_size, config.vocab_size, bias=False, rngs=rngs)
        self.q_head = CastedLinear(config.hidden_size, 2, bias=True, rngs=rngs)
        # Q head starts (almost) at zero so nothing halts early in training from scratch
        self.q_head.weight[...] = jnp.zeros_like(self.q_head.weight[...])
        self.q_head.bias[...] = jnp.full_like(self.q_head.bias[...], -5.0)
        self.puzzle_emb_len = config.prefix_len
        if config.puzzle_emb_ndim > 0:
            self.puzzle_emb = CastedSparseEmbedding(
                config.num_puzzle_identifiers, config.puzzle_emb_ndim, self.forward_dtype
            )
        if config.pos_encodings == "learned":
            self.embed_pos = CastedEmbedding(
                config.total_len, config.hidden_size, embed_init_std, self.forward_dtype, rngs=rngs
            )
        self._build(config, rngs)
        for name in self.init_names:
            value = trunc_normal(rngs.params(), (config.hidden_size,), 1.0, self.forward_dtype)
            setattr(self, name, LatentInit(value))

    def _build(self, config: TRMConfig, rngs: nnx.Rngs) -> None:
        raise NotImplementedError

    def cos_sin(self):
        c = self.config
        if c.pos_encodings != "rope":
            return None
        return rope_tables(c.head_dim, c.total_len, c.rope_theta, self.forward_dtype)

    def input_embeddings(self, inputs, puzzle_identifiers, puzzle_emb_delta=None):
        c = self.config
        embedding = self.embed_tokens(inputs.astype(jnp.int32))
        if c.puzzle_emb_ndim > 0:
            puzzle = self.puzzle_emb(puzzle_identifiers, puzzle_emb_delta)
            pad = self.puzzle_emb_len * c.hidden_size - puzzle.shape[-1]
            if pad > 0:
                puzzle = jnp.pad(puzzle, ((0, 0), (0, pad)))
            puzzle = puzzle.reshape(-1, self.puzzle_emb_len, c.hidden_size)
            embedding = jnp.concatenate([puzzle, embedding], axis=-2)
        if c.pos_encodings == "learned":
            # scale by 1/sqrt(2) to keep the forward variance (upstream's constant)
            embedding = 0.707106781 * (
                embedding + self.embed_pos.embedding_weight[...].astype(self.forward_dtype)
            )
        # everything, puzzle prefix included, is scaled by sqrt(hidden)
        return self.embed_scale * embedding

    def empty_carry(self, batch_size: int) -> dict:
        shape = (batch_size, self.config.total_len, self.config.hidden_size)
        return {n: jnp.zeros(shape, self.forward_dtype) for n in self.latent_names}

    def reset_carry(self, reset_flag, carry: dict) -> dict:
        flag = reset_flag.reshape(-1, 1, 1)
        return {
            n: jnp.where(flag, getattr(self, i)[...], carry[n])
            for n, i in zip(self.latent_names, self.init_names, strict=True)
        }

    def heads(self, z_out):
        logits = self.lm_head(z_out)[:, self.puzzle_emb_len :]
        # first puzzle-prefix position; upstream casts to float32 ("at least": float64 stays)
        q_logits = self.q_head(z_out[:, 0]).astype(jnp.promote_types(jnp.float32, z_out.dtype))
        record("logits", logits)
        record("q_logits", q_logits)
        return logits, (q_logits[..., 0], q_logits[..., 1])

    def recursion(self, carry: dict, x, cos_sin) -> tuple[dict, jax.Array]:
        """Returns (new latents, the latent read by the heads)."""
        raise NotImplementedError

    def __call__(self, carry: dict, batch: dict, puzzle_emb_delta=None):
        cos_sin = self.cos_sin()
        x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"], puzzle_emb_delta)
        record("input_embedding", x)
        record("puzzle_prefix", x[:, : self.puzzle_emb_len])
        new_carry, z_out = self.recursion(carry, x, cos_sin)
        for n in self.latent_names:
            record(n, new_carry[n])
        # torch: new carry built from .detach()ed latents (no backprop across ACT steps)
        new_carry = jax.tree.map(jax.lax.stop_gradient, new_carry)
        logits, q = self.heads(z_out)
        return new_carry, logits, q


def repeat(fn, z, n: int, use_scan: bool):
    """z <- fn(z) n times; with `scan`, a lax.scan (one traced body) instead of a Python loop."""
    if use_scan and n > 1:
        z, _ = jax.lax.scan(lambda c, _: (fn(c), None), z, None, length=n)
        return z
    for _ in range(n):
        z = fn(z)
    return z


class TRMInner(InnerBase):
    """One shared network `L_level` updates both latents (upstream's single module)."""

    def _build(self, config, rngs):
        self.L_level = ReasoningModule(config, config.L_layers, "L_level", rngs=rngs)

    def _cycle(self, z_H, z_L, x, cos_sin, h: int):
        c = self.config

        def l_step(z_L):
            return self.L_level(z_L, z_H + x, cos_sin)

        with _tag(f"H{h}/L"):
            z_L = repeat(l_step, z_L, c.L_cycles, c.scan)
        with _tag(f"H{h}/H"):
            z_H = self.L_level(z_H, z_L, cos_sin)
        return z_H, z_L

    def recursion(self, carry, x, cos_sin):
        z_H, z_L = carry["z_H"], carry["z_L"]
        for h in range(self.config.H_cycles - 1):
            z_H, z_L = self._cycle(z_H, z_L, x, cos_sin, h)
        # torch.no_grad over the first H_cycles-1 cycles: cut the graph behind them (x is not cut)
        z_H, z_L = jax.lax.stop_gradient(z_H), jax.lax.stop_gradient(z_L)
        z_H, z_L = self._cycle(z_H, z_L, x, cos_sin, self.config.H_cycles - 1)
        return {"z_H": z_H, "z_L": z_L}, z_H


def _inner_class(arch: str):
    if arch == "trm":
        return TRMInner
    if arch == "hrm":
        from models.trm.hrm import HRMInner

        return HRMInner
    from models.trm import variants

    return {
        "trm_singlez": variants.SingleZInner,
        "trm_hier6": variants.Hier6Inner,
        "transformers_baseline": variants.BaselineInner,
    }[arch]


class TRM(nnx.Module):
    """The ACT wrapper: carry, slot refill, halting, exploration (upstream ..._ACTV1).

    `model(carry, batch, *, puzzle_emb_delta=None, exploration=None)` returns (carry, outputs).
    `exploration` = (uniform [B] float in [0, 1), min_halt_draw [B] int in [2, halt_max_steps]):
    a row explores when uniform < halt_exploration_prob and then may not halt before
    min_halt_draw steps (upstream: rand_like / randint_like). None: both are drawn from this
    model's own `exploration` RNG stream (nnx state, advanced every call, checkpointable).
    """

    def __init__(self, config: TRMConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.inner = _inner_class(config.arch)(config, rngs=rngs)
        key = rngs.exploration() if "exploration" in rngs else rngs.params()
        self.exploration_rngs = nnx.Rngs(exploration=key)
        self.training = True  # torch modules start in train mode

    # torch's .train()/.eval(): halting is adaptive only in training
    def train(self, **attributes):
        self.training = True
        return super().train(**attributes)

    def eval(self, **attributes):
        self.training = False
        return super().eval(**attributes)

    @property
    def puzzle_emb(self):
        return self.inner.puzzle_emb

    def initial_carry(self, batch: dict) -> TRMCarry:
        b = batch["inputs"].shape[0]
        return TRMCarry(
            # upstream uses torch.empty (garbage); every row starts halted so it is reset anyway
            inner_carry=self.inner.empty_carry(b),
            steps=jnp.zeros((b,), jnp.int32),
            halted=jnp.ones((b,), jnp.bool_),
            current_data={k: jnp.zeros_like(v) for k, v in batch.items()},
        )

    def _adaptive(self) -> bool:
        c = self.config
        if c.halt_max_steps <= 1:
            return False
        if c.arch == "transformers_baseline":
            return (self.training and c.act_enabled) or (not self.training and c.act_inference)
        return self.training

    def _exploration_draws(self, b: int, exploration):
        if exploration is not None:
            u, k = exploration
            return jnp.asarray(u, jnp.float32), jnp.asarray(k, jnp.int32)
        # torch.rand_like / randint_like: one draw PER ROW from an explicit stream
        ku, kk = jax.random.split(self.exploration_rngs.exploration())
        u = jax.random.uniform(ku, (b,), jnp.float32)
        k = jax.random.randint(kk, (b,), 2, self.config.halt_max_steps + 1, jnp.int32)
        return u, k

    def halting_rule(self, q_halt, q_continue):
        """Where the Q head halts a row: q_halt > 0 for TRM; q_halt > q_continue for HRM, the
        baseline and no_ACT_continue=False (upstream's rules)."""
        c = self.config
        if c.arch in ("hrm", "transformers_baseline") or not c.no_ACT_continue:
            return q_halt > q_continue
        return q_halt > 0

    def __call__(
        self,
        carry: TRMCarry,
        batch: dict,
        *,
        puzzle_emb_delta=None,
        exploration=None,
        compute_target_q: bool | None = None,
    ):
        c = self.config
        halted = carry.halted
        new_inner = self.inner.reset_carry(halted, carry.inner_carry)
        new_steps = jnp.where(halted, 0, carry.steps)
        new_data = {
            k: jnp.where(halted.reshape((-1,) + (1,) * (batch[k].ndim - 1)), batch[k], v)
            for k, v in carry.current_data.items()
        }
        new_inner, logits, (q_halt, q_continue) = self.inner(new_inner, new_data, puzzle_emb_delta)
        outputs = {"logits": logits, "q_halt_logits": q_halt, "q_continue_logits": q_continue}

        # torch.no_grad block: the halting decision carries no gradient
        q_halt_ng, q_cont_ng = jax.lax.stop_gradient(q_halt), jax.lax.stop_gradient(q_continue)
        new_steps = new_steps + 1
        is_last = new_steps >= c.halt_max_steps
        new_halted = is_last
        if self._adaptive():
            new_halted = new_halted | self.halting_rule(q_halt_ng, q_cont_ng)
            if self.training:
                u, k = self._exploration_draws(q_halt.shape[0], exploration)
                min_halt = jnp.where(u < c.halt_exploration_prob, k, 0)
                new_halted = new_halted & (new_steps >= min_halt)
            want_target = self.training and (
                compute_target_q
                if c.arch == "transformers_baseline"
                else (c.arch == "hrm" or not c.no_ACT_continue)
            )
            if want_target:
                # second inner call on the new carry (no replay buffer / target network upstream);
                # upstream TRM unpacks 5 values from 3 here and crashes: we compute it (docs).
                _, _, (nq_halt, nq_cont) = self.inner(new_inner, new_data, puzzle_emb_delta)
                nq_halt, nq_cont = jax.lax.stop_gradient(nq_halt), jax.lax.stop_gradient(nq_cont)
                outputs["target_q_continue"] = jax.nn.sigmoid(
                    jnp.where(is_last, nq_halt, jnp.maximum(nq_halt, nq_cont))
                )
        new_carry = TRMCarry(new_inner, new_steps.astype(jnp.int32), new_halted, new_data)
        return new_carry, outputs
