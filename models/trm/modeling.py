"""The Tiny Recursive Model and its variants in Flax NNX (upstream models/recursive_reasoning/).

Read beside parity/trm_torch/modeling.py: the same classes in the same order, with the same names and
argument orders. `Block` and `ReasoningModule` are upstream trm.py's
TinyRecursiveReasoningModel_ACTV1Block / _ReasoningModule; the five inners (one ACT step of
recursion: trm.py, hrm.py, trm_singlez.py, trm_hier6.py, transformers_baseline.py) share
`InnerBase` and are picked from `INNERS` by `TRMConfig.arch`; the ACT wrapper and its carry keep
upstream's names, TinyRecursiveReasoningModel_ACTV1 and TinyRecursiveReasoningModel_ACTV1Carry.

Axis names in variable suffixes: B batch, L positions (puzzle prefix + tokens), D hidden size,
V vocabulary, P puzzle_emb_ndim.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from models.trm.config import TRMConfig
from models.trm.layers import (
    Attention,
    CastedEmbedding,
    CastedLinear,
    CastedSparseEmbedding,
    LatentInit,
    RotaryEmbedding,
    SwiGLU,
    rms_norm,
    trunc_normal,
)


class Block(nnx.Module):
    """Post-norm block: attention + SwiGLU, or (mlp_t) a token-mixing SwiGLU + SwiGLU."""

    def __init__(self, config: TRMConfig, *, rngs: nnx.Rngs):
        # config.block_mlp_t: mlp_t, except for the transformers_baseline (attention blocks only)
        self.use_mlp_t = config.block_mlp_t
        if self.use_mlp_t:
            self.mlp_t = SwiGLU(
                config.total_len, config.expansion, split=config.split_gate_up, rngs=rngs
            )
        else:
            self.self_attn = Attention(
                config.hidden_size,
                config.head_dim,
                config.num_heads,
                attention_impl=config.attention_impl,
                rngs=rngs,
            )
        self.mlp = SwiGLU(
            config.hidden_size, config.expansion, split=config.split_gate_up, rngs=rngs
        )
        self.norm_eps = config.rms_norm_eps
        self.remat, self.remat_policy = config.remat, config.remat_policy  # ours, not upstream

    def __call__(self, cos_sin, hidden_states):  # torch's forward, plus our remat option
        if self.remat:
            # activation checkpointing: recompute (what the policy does not keep of) the block in
            # the backward pass
            policy = getattr(jax.checkpoint_policies, self.remat_policy)
            return jax.checkpoint(self._forward, policy=policy)(cos_sin, hidden_states)
        return self._forward(cos_sin, hidden_states)

    def _forward(self, cos_sin, h_bld):
        if self.use_mlp_t:
            h_bdl = jnp.swapaxes(h_bld, 1, 2)  # the MLP and the norm act over tokens
            h_bdl = rms_norm(h_bdl + self.mlp_t(h_bdl), self.norm_eps)
            h_bld = jnp.swapaxes(h_bdl, 1, 2)
        else:
            h_bld = rms_norm(
                h_bld + self.self_attn(cos_sin=cos_sin, hidden_states=h_bld), self.norm_eps
            )
        return rms_norm(h_bld + self.mlp(h_bld), self.norm_eps)


class ReasoningModule(nnx.Module):
    """h <- h + injection (once), then the blocks in order."""

    def __init__(self, layers):
        self.layers = nnx.List(layers)

    def __call__(self, hidden_states, input_injection=None, cos_sin=None):
        h_bld = hidden_states
        if input_injection is not None:
            h_bld = h_bld + input_injection
        for layer in self.layers:
            h_bld = layer(cos_sin=cos_sin, hidden_states=h_bld)
        return h_bld


def _forward_dtype(config: TRMConfig):
    if config.forward_dtype == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(
            "TRMConfig.forward_dtype='float64' needs jax x64: wrap the code in "
            "`with jax.enable_x64(True):` or set jax.config.update('jax_enable_x64', True)"
        )
    return jnp.dtype(config.forward_dtype)


def _repeat(fn, z_bld, n: int, use_scan: bool):
    """z <- fn(z) n times; with `scan` (ours), a lax.scan (one traced body) instead of a loop."""
    if use_scan and n > 1:
        z_bld, _ = jax.lax.scan(lambda z, _: (fn(z), None), z_bld, None, length=n)
        return z_bld
    for _ in range(n):
        z_bld = fn(z_bld)
    return z_bld


class InnerBase(nnx.Module):
    """What every inner shares (upstream repeats it in each file): token/puzzle/position
    embeddings, lm_head, q_head, RoPE, the latent init buffers, carry reset and the heads."""

    latent_names: tuple[str, ...] = ("z_H", "z_L")
    init_names: tuple[str, ...] = ("H_init", "L_init")

    def __init__(self, config: TRMConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.forward_dtype = _forward_dtype(config)
        self.embed_scale = math.sqrt(config.hidden_size)
        std = 1.0 / self.embed_scale
        self.embed_tokens = CastedEmbedding(
            config.vocab_size,
            config.hidden_size,
            std,
            self.forward_dtype,
            grad=config.embed_grad,
            rngs=rngs,
        )
        self.lm_head = CastedLinear(config.hidden_size, config.vocab_size, bias=False, rngs=rngs)
        self.q_head = CastedLinear(config.hidden_size, 2, bias=True, rngs=rngs)
        self.puzzle_emb_len = config.prefix_len
        if config.puzzle_emb_ndim > 0:
            self.puzzle_emb = CastedSparseEmbedding(
                config.num_puzzle_identifiers, config.puzzle_emb_ndim, self.forward_dtype
            )
        if config.pos_encodings == "rope":
            self.rotary_emb = RotaryEmbedding(
                config.head_dim, config.total_len, config.rope_theta, self.forward_dtype
            )
        elif config.pos_encodings == "learned":
            self.embed_pos = CastedEmbedding(
                config.total_len,
                config.hidden_size,
                std,
                self.forward_dtype,
                grad=config.embed_grad,
                rngs=rngs,
            )
        self._build(config, rngs)
        for name in self.init_names:
            value = trunc_normal(rngs.params(), (config.hidden_size,), 1.0, self.forward_dtype)
            setattr(self, name, LatentInit(value))
        # Q head starts (almost) at zero so nothing halts early in training from scratch
        self.q_head.weight[...] = jnp.zeros_like(self.q_head.weight[...])
        self.q_head.bias[...] = jnp.full_like(self.q_head.bias[...], -5.0)

    def _build(self, config: TRMConfig, rngs: nnx.Rngs) -> None:
        raise NotImplementedError

    def _input_embeddings(self, inputs, puzzle_identifiers, puzzle_emb_delta=None):
        c = self.config
        embedding_bld = self.embed_tokens(inputs.astype(jnp.int32))
        if c.puzzle_emb_ndim > 0:
            puzzle_bp = self.puzzle_emb(puzzle_identifiers, puzzle_emb_delta)
            pad = self.puzzle_emb_len * c.hidden_size - puzzle_bp.shape[-1]
            if pad > 0:
                puzzle_bp = jnp.pad(puzzle_bp, ((0, 0), (0, pad)))
            embedding_bld = jnp.concatenate(
                [puzzle_bp.reshape(-1, self.puzzle_emb_len, c.hidden_size), embedding_bld], axis=-2
            )
        if c.pos_encodings == "learned":
            # scale by 1/sqrt(2) to keep the forward variance (upstream's constant)
            embedding_bld = 0.707106781 * (
                embedding_bld + self.embed_pos.embedding_weight[...].astype(self.forward_dtype)
            )
        # everything, puzzle prefix included, is scaled by sqrt(hidden)
        return self.embed_scale * embedding_bld

    def empty_carry(self, batch_size: int) -> dict:
        shape = (batch_size, self.config.total_len, self.config.hidden_size)
        return {n: jnp.zeros(shape, self.forward_dtype) for n in self.latent_names}

    def reset_carry(self, reset_flag, carry: dict) -> dict:
        flag_b11 = reset_flag.reshape(-1, 1, 1)
        return {
            n: jnp.where(flag_b11, getattr(self, i)[...], carry[n])
            for n, i in zip(self.latent_names, self.init_names, strict=True)
        }

    def heads(self, z_bld):
        logits_blv = self.lm_head(z_bld)[:, self.puzzle_emb_len :]
        # first puzzle-prefix position; upstream casts to float32 ("at least": float64 stays)
        q_b2 = self.q_head(z_bld[:, 0]).astype(jnp.promote_types(jnp.float32, z_bld.dtype))
        return logits_blv, (q_b2[..., 0], q_b2[..., 1])

    def recursion(self, carry: dict, x_bld, cos_sin) -> tuple[dict, jax.Array]:
        """Returns (new latents, the latent read by the heads)."""
        raise NotImplementedError

    def __call__(self, carry: dict, batch: dict, puzzle_emb_delta=None):
        cos_sin = self.rotary_emb() if hasattr(self, "rotary_emb") else None
        x_bld = self._input_embeddings(
            batch["inputs"], batch["puzzle_identifiers"], puzzle_emb_delta
        )
        new_carry, z_bld = self.recursion(carry, x_bld, cos_sin)
        # torch: new carry built from .detach()ed latents (no backprop across ACT steps)
        new_carry = jax.tree.map(jax.lax.stop_gradient, new_carry)
        logits_blv, q = self.heads(z_bld)
        return new_carry, logits_blv, q


class TRMInner(InnerBase):
    """trm.py's TinyRecursiveReasoningModel_ACTV1_Inner: one shared `L_level` updates both latents."""

    def _build(self, config, rngs):
        self.L_level = ReasoningModule([Block(config, rngs=rngs) for _ in range(config.L_layers)])

    def _cycle(self, z_H, z_L, x_bld, cos_sin):
        z_L = _repeat(
            lambda z: self.L_level(z, z_H + x_bld, cos_sin),
            z_L,
            self.config.L_cycles,
            self.config.scan,
        )
        return self.L_level(z_H, z_L, cos_sin), z_L

    def recursion(self, carry, x_bld, cos_sin):
        z_H, z_L = carry["z_H"], carry["z_L"]
        for _ in range(self.config.H_cycles - 1):
            z_H, z_L = self._cycle(z_H, z_L, x_bld, cos_sin)
        # torch.no_grad over the first H_cycles-1 cycles: cut the graph behind them (x is not cut)
        z_H, z_L = jax.lax.stop_gradient(z_H), jax.lax.stop_gradient(z_L)
        z_H, z_L = self._cycle(z_H, z_L, x_bld, cos_sin)
        return {"z_H": z_H, "z_L": z_L}, z_H


class HRMInner(InnerBase):
    """hrm.py's HierarchicalReasoningModel_ACTV1_Inner: two modules, 1-step gradient."""

    def _build(self, config, rngs):
        self.H_level = ReasoningModule([Block(config, rngs=rngs) for _ in range(config.H_layers)])
        self.L_level = ReasoningModule([Block(config, rngs=rngs) for _ in range(config.L_layers)])

    def recursion(self, carry, x_bld, cos_sin):
        c = self.config
        z_H, z_L = carry["z_H"], carry["z_L"]
        # torch.no_grad over everything except the very last L update and the last H update
        for h in range(c.H_cycles):
            for j in range(c.L_cycles):
                if not (h == c.H_cycles - 1 and j == c.L_cycles - 1):
                    z_L = self.L_level(z_L, z_H + x_bld, cos_sin)
            if h != c.H_cycles - 1:
                z_H = self.H_level(z_H, z_L, cos_sin)
        z_H, z_L = jax.lax.stop_gradient(z_H), jax.lax.stop_gradient(z_L)
        # 1-step gradient
        z_L = self.L_level(z_L, z_H + x_bld, cos_sin)
        z_H = self.H_level(z_H, z_L, cos_sin)
        return {"z_H": z_H, "z_L": z_L}, z_H


class SingleZInner(InnerBase):
    """trm_singlez.py: one latent; z_L <- f(z_L + x) L_cycles times, then z_L <- f(z_L)."""

    latent_names = ("z_L",)
    init_names = ("L_init",)

    def _build(self, config, rngs):
        self.L_level = ReasoningModule([Block(config, rngs=rngs) for _ in range(config.L_layers)])

    def _cycle(self, z_L, x_bld, cos_sin):
        # injection added outside the module (upstream's singlez ReasoningModule takes none)
        z_L = _repeat(
            lambda z: self.L_level(z + x_bld, None, cos_sin),
            z_L,
            self.config.L_cycles,
            self.config.scan,
        )
        return self.L_level(z_L, None, cos_sin)

    def recursion(self, carry, x_bld, cos_sin):
        z_L = carry["z_L"]
        for _ in range(self.config.H_cycles - 1):
            z_L = self._cycle(z_L, x_bld, cos_sin)
        z_L = jax.lax.stop_gradient(z_L)  # torch.no_grad over the first H_cycles-1 cycles
        z_L = self._cycle(z_L, x_bld, cos_sin)
        return {"z_L": z_L}, z_L


class Hier6Inner(InnerBase):
    """trm_hier6.py: six latents; L step j replaces z_L[j] with f(sum z_L, z_H + x); the H step
    uses sum z_L."""

    latent_names = ("z_H", "z_L1", "z_L2", "z_L3", "z_L4", "z_L5", "z_L6")
    init_names = ("H_init", "L1_init", "L2_init", "L3_init", "L4_init", "L5_init", "L6_init")

    def _build(self, config, rngs):
        self.L_level = ReasoningModule([Block(config, rngs=rngs) for _ in range(config.L_layers)])

    def _cycle(self, z_H, z_L, x_bld, cos_sin):
        z_L = list(z_L)
        for j in range(self.config.L_cycles):
            z_L[j] = self.L_level(
                z_L[0] + z_L[1] + z_L[2] + z_L[3] + z_L[4] + z_L[5], z_H + x_bld, cos_sin
            )
        z_H = self.L_level(z_H, z_L[0] + z_L[1] + z_L[2] + z_L[3] + z_L[4] + z_L[5], cos_sin)
        return z_H, z_L

    def recursion(self, carry, x_bld, cos_sin):
        z_H, z_L = carry["z_H"], [carry[n] for n in self.latent_names[1:]]
        for _ in range(self.config.H_cycles - 1):
            z_H, z_L = self._cycle(z_H, z_L, x_bld, cos_sin)
        z_H, z_L = jax.tree.map(jax.lax.stop_gradient, (z_H, z_L))  # torch.no_grad cycles
        z_H, z_L = self._cycle(z_H, z_L, x_bld, cos_sin)
        return {"z_H": z_H, **dict(zip(self.latent_names[1:], z_L, strict=True))}, z_H


class BaselineInner(InnerBase):
    """transformers_baseline.py's Model_ACTV2_Inner: H_level once per ACT step, with gradient."""

    latent_names = ("z_H",)
    init_names = ("H_init",)

    def _build(self, config, rngs):
        self.H_level = ReasoningModule([Block(config, rngs=rngs) for _ in range(config.H_layers)])

    def recursion(self, carry, x_bld, cos_sin):
        z_H = self.H_level(carry["z_H"], x_bld, cos_sin)
        return {"z_H": z_H}, z_H


INNERS = {
    "trm": TRMInner,
    "hrm": HRMInner,
    "trm_singlez": SingleZInner,
    "trm_hier6": Hier6Inner,
    "transformers_baseline": BaselineInner,
}


@struct.dataclass
class TinyRecursiveReasoningModel_ACTV1Carry:  # upstream's name
    """Upstream's ACT carry as a pytree of arrays (jit-, shard-, donate- and checkpoint-able)."""

    inner_carry: dict  # {"z_H": [B, L, D], "z_L": [B, L, D]} (variants: their own latents)
    steps: jax.Array  # int32 [B]
    halted: jax.Array  # bool [B]
    current_data: dict  # the batch rows currently held by each slot


class TinyRecursiveReasoningModel_ACTV1(nnx.Module):  # upstream's name
    """The ACT wrapper: carry, slot refill, halting, exploration, for every arch.

    `model(carry, batch, *, puzzle_emb_delta=None)` returns (carry, outputs). In training a row
    explores when its uniform draw in [0, 1) is below halt_exploration_prob, and then may not halt
    before its min_halt_draw in [2, halt_max_steps] (upstream: rand_like / randint_like, one draw
    per row): both come from this model's own `exploration` RNG stream (nnx state, advanced every
    call, checkpointed with the weights).
    """

    def __init__(self, config: TRMConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.inner = INNERS[config.arch](config, rngs=rngs)
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

    def initial_carry(self, batch: dict) -> TinyRecursiveReasoningModel_ACTV1Carry:
        b = batch["inputs"].shape[0]
        return TinyRecursiveReasoningModel_ACTV1Carry(
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

    def halting_rule(self, q_halt_b, q_continue_b):
        """Where the Q head halts a row: q_halt > 0 for TRM; q_halt > q_continue for HRM, the
        baseline and no_ACT_continue=False (upstream's rules)."""
        c = self.config
        if c.arch in ("hrm", "transformers_baseline") or not c.no_ACT_continue:
            return q_halt_b > q_continue_b
        return q_halt_b > 0

    def _exploration_draws(self, b: int):
        # torch.rand_like / randint_like: one draw PER ROW from an explicit stream
        key_u, key_k = jax.random.split(self.exploration_rngs.exploration())
        u_b = jax.random.uniform(key_u, (b,), jnp.float32)
        k_b = jax.random.randint(key_k, (b,), 2, self.config.halt_max_steps + 1, jnp.int32)
        return u_b, k_b

    def __call__(
        self,
        carry: TinyRecursiveReasoningModel_ACTV1Carry,
        batch: dict,
        *,
        puzzle_emb_delta=None,
        compute_target_q: bool | None = None,
    ):
        c = self.config
        halted_b = carry.halted
        new_inner = self.inner.reset_carry(halted_b, carry.inner_carry)
        new_steps_b = jnp.where(halted_b, 0, carry.steps)
        new_data = {
            k: jnp.where(halted_b.reshape((-1,) + (1,) * (batch[k].ndim - 1)), batch[k], v)
            for k, v in carry.current_data.items()
        }
        new_inner, logits, (q_halt, q_continue) = self.inner(new_inner, new_data, puzzle_emb_delta)
        outputs = {"logits": logits, "q_halt_logits": q_halt, "q_continue_logits": q_continue}

        # torch.no_grad block: the halting decision carries no gradient
        q_halt_ng, q_cont_ng = jax.lax.stop_gradient(q_halt), jax.lax.stop_gradient(q_continue)
        new_steps_b = new_steps_b + 1
        is_last_b = new_steps_b >= c.halt_max_steps
        new_halted_b = is_last_b
        if self._adaptive():
            new_halted_b = new_halted_b | self.halting_rule(q_halt_ng, q_cont_ng)
            if self.training:
                u_b, k_b = self._exploration_draws(q_halt.shape[0])
                min_halt_b = jnp.where(u_b < c.halt_exploration_prob, k_b, 0)
                new_halted_b = new_halted_b & (new_steps_b >= min_halt_b)
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
                    jnp.where(is_last_b, nq_halt, jnp.maximum(nq_halt, nq_cont))
                )
        new_carry = TinyRecursiveReasoningModel_ACTV1Carry(
            new_inner, new_steps_b.astype(jnp.int32), new_halted_b, new_data
        )
        return new_carry, outputs


# Short names for upstream's long class names (models.trm.TRM / TRMCarry)
TRM = TinyRecursiveReasoningModel_ACTV1
TRMCarry = TinyRecursiveReasoningModel_ACTV1Carry
