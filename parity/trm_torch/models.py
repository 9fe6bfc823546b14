"""Torch reference of TRM (trm.py), HRM (hrm.py), trm_singlez, trm_hier6 and the transformer
baseline, with upstream's attribute names. `build_model(TRMConfig)` picks the inner by `arch`."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from parity.trm_torch.layers import (
    Attention,
    CastedEmbedding,
    CastedLinear,
    CastedSparseEmbedding,
    RotaryEmbedding,
    SwiGLU,
    rms_norm,
    trunc_normal_,
)


class Block(nn.Module):
    def __init__(self, config, mlp_t: bool):
        super().__init__()
        self.use_mlp_t = mlp_t
        if mlp_t:
            self.mlp_t = SwiGLU(config.total_len, config.expansion)
        else:
            self.self_attn = Attention(config.hidden_size, config.head_dim, config.num_heads)
        self.mlp = SwiGLU(config.hidden_size, config.expansion)
        self.norm_eps = config.rms_norm_eps

    def forward(self, cos_sin, hidden_states):
        h = hidden_states
        if self.use_mlp_t:
            h = h.transpose(1, 2)  # B, D, L: the MLP and the norm act over tokens
            h = rms_norm(h + self.mlp_t(h), self.norm_eps)
            h = h.transpose(1, 2)
        else:
            h = rms_norm(h + self.self_attn(cos_sin=cos_sin, hidden_states=h), self.norm_eps)
        return rms_norm(h + self.mlp(h), self.norm_eps)


class ReasoningModule(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, hidden_states, input_injection=None, cos_sin=None):
        if input_injection is not None:
            hidden_states = hidden_states + input_injection
        for layer in self.layers:
            hidden_states = layer(cos_sin=cos_sin, hidden_states=hidden_states)
        return hidden_states


class InnerBase(nn.Module):
    latent_names = ("z_H", "z_L")
    init_names = ("H_init", "L_init")

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.forward_dtype = getattr(torch, config.forward_dtype)
        self.embed_scale = math.sqrt(config.hidden_size)
        std = 1.0 / self.embed_scale
        self.embed_tokens = CastedEmbedding(
            config.vocab_size, config.hidden_size, std, self.forward_dtype
        )
        self.lm_head = CastedLinear(config.hidden_size, config.vocab_size, bias=False)
        self.q_head = CastedLinear(config.hidden_size, 2, bias=True)
        self.puzzle_emb_len = config.prefix_len
        if config.puzzle_emb_ndim > 0:
            self.puzzle_emb = CastedSparseEmbedding(
                config.num_puzzle_identifiers,
                config.puzzle_emb_ndim,
                config.batch_size,
                0,
                self.forward_dtype,
            )
        if config.pos_encodings == "rope":
            self.rotary_emb = RotaryEmbedding(
                config.head_dim, config.total_len, config.rope_theta, self.forward_dtype
            )
        elif config.pos_encodings == "learned":
            self.embed_pos = CastedEmbedding(
                config.total_len, config.hidden_size, std, self.forward_dtype
            )
        self.build(config)
        for name in self.init_names:
            buf = trunc_normal_(torch.empty(config.hidden_size, dtype=self.forward_dtype), 1.0)
            setattr(self, name, nn.Buffer(buf, persistent=True))
        with torch.no_grad():
            self.q_head.weight.zero_()
            self.q_head.bias.fill_(-5)

    def build(self, config):
        raise NotImplementedError

    def block(self, config):
        return Block(config, mlp_t=config.mlp_t and config.arch != "transformers_baseline")

    def _input_embeddings(self, inputs, puzzle_identifiers):
        c = self.config
        embedding = self.embed_tokens(inputs.to(torch.int32))
        if c.puzzle_emb_ndim > 0:
            puzzle = self.puzzle_emb(puzzle_identifiers)
            pad = self.puzzle_emb_len * c.hidden_size - puzzle.shape[-1]
            if pad > 0:
                puzzle = F.pad(puzzle, (0, pad))
            embedding = torch.cat(
                (puzzle.view(-1, self.puzzle_emb_len, c.hidden_size), embedding), dim=-2
            )
        if c.pos_encodings == "learned":
            embedding = 0.707106781 * (
                embedding + self.embed_pos.embedding_weight.to(self.forward_dtype)
            )
        return self.embed_scale * embedding

    def empty_carry(self, batch_size):
        shape = (batch_size, self.config.total_len, self.config.hidden_size)
        return {n: torch.zeros(shape, dtype=self.forward_dtype) for n in self.latent_names}

    def reset_carry(self, reset_flag, carry):
        flag = reset_flag.view(-1, 1, 1)
        return {
            n: torch.where(flag, getattr(self, i), carry[n])
            for n, i in zip(self.latent_names, self.init_names)
        }

    def forward(self, carry, batch):
        cos_sin = self.rotary_emb() if hasattr(self, "rotary_emb") else None
        x = self._input_embeddings(batch["inputs"], batch["puzzle_identifiers"])
        new_carry, z_out = self.recursion(carry, x, cos_sin)
        new_carry = {k: v.detach() for k, v in new_carry.items()}
        logits = self.lm_head(z_out)[:, self.puzzle_emb_len :]
        # upstream casts to float32; "at least float32" keeps a float64 run in float64
        q = self.q_head(z_out[:, 0]).to(torch.promote_types(torch.float32, z_out.dtype))
        return new_carry, logits, (q[..., 0], q[..., 1])


class TRMInner(InnerBase):
    def build(self, config):
        self.L_level = ReasoningModule([self.block(config) for _ in range(config.L_layers)])

    def recursion(self, carry, x, cos_sin):
        c = self.config
        z_H, z_L = carry["z_H"], carry["z_L"]
        with torch.no_grad():
            for _ in range(c.H_cycles - 1):
                for _ in range(c.L_cycles):
                    z_L = self.L_level(z_L, z_H + x, cos_sin)
                z_H = self.L_level(z_H, z_L, cos_sin)
        for _ in range(c.L_cycles):
            z_L = self.L_level(z_L, z_H + x, cos_sin)
        z_H = self.L_level(z_H, z_L, cos_sin)
        return {"z_H": z_H, "z_L": z_L}, z_H


class HRMInner(InnerBase):
    def build(self, config):
        self.H_level = ReasoningModule([self.block(config) for _ in range(config.H_layers)])
        self.L_level = ReasoningModule([self.block(config) for _ in range(config.L_layers)])

    def recursion(self, carry, x, cos_sin):
        c = self.config
        with torch.no_grad():
            z_H, z_L = carry["z_H"], carry["z_L"]
            for h in range(c.H_cycles):
                for j in range(c.L_cycles):
                    if not (h == c.H_cycles - 1 and j == c.L_cycles - 1):
                        z_L = self.L_level(z_L, z_H + x, cos_sin)
                if h != c.H_cycles - 1:
                    z_H = self.H_level(z_H, z_L, cos_sin)
        z_L = self.L_level(z_L, z_H + x, cos_sin)
        z_H = self.H_level(z_H, z_L, cos_sin)
        return {"z_H": z_H, "z_L": z_L}, z_H


class SingleZInner(InnerBase):
    latent_names = ("z_L",)
    init_names = ("L_init",)

    def build(self, config):
        self.L_level = ReasoningModule([self.block(config) for _ in range(config.L_layers)])

    def recursion(self, carry, x, cos_sin):
        c = self.config
        z_L = carry["z_L"]
        with torch.no_grad():
            for _ in range(c.H_cycles - 1):
                for _ in range(c.L_cycles):
                    z_L = self.L_level(z_L + x, None, cos_sin)
                z_L = self.L_level(z_L, None, cos_sin)
        for _ in range(c.L_cycles):
            z_L = self.L_level(z_L + x, None, cos_sin)
        z_L = self.L_level(z_L, None, cos_sin)
        return {"z_L": z_L}, z_L


class Hier6Inner(InnerBase):
    latent_names = ("z_H", "z_L1", "z_L2", "z_L3", "z_L4", "z_L5", "z_L6")
    init_names = ("H_init", "L1_init", "L2_init", "L3_init", "L4_init", "L5_init", "L6_init")

    def build(self, config):
        self.L_level = ReasoningModule([self.block(config) for _ in range(config.L_layers)])

    def recursion(self, carry, x, cos_sin):
        c = self.config
        z_H, z_L = carry["z_H"], [carry[n] for n in self.latent_names[1:]]

        def cycle(z_H, z_L):
            for j in range(c.L_cycles):
                z_L[j] = self.L_level(
                    z_L[0] + z_L[1] + z_L[2] + z_L[3] + z_L[4] + z_L[5], z_H + x, cos_sin
                )
            return self.L_level(z_H, z_L[0] + z_L[1] + z_L[2] + z_L[3] + z_L[4] + z_L[5], cos_sin)

        with torch.no_grad():
            for _ in range(c.H_cycles - 1):
                z_H = cycle(z_H, z_L)
        z_H = cycle(z_H, z_L)
        return {"z_H": z_H, **dict(zip(self.latent_names[1:], z_L))}, z_H


class BaselineInner(InnerBase):
    latent_names = ("z_H",)
    init_names = ("H_init",)

    def build(self, config):
        self.H_level = ReasoningModule([self.block(config) for _ in range(config.H_layers)])

    def recursion(self, carry, x, cos_sin):
        z_H = self.H_level(carry["z_H"], x, cos_sin)
        return {"z_H": z_H}, z_H


INNERS = {
    "trm": TRMInner,
    "hrm": HRMInner,
    "trm_singlez": SingleZInner,
    "trm_hier6": Hier6Inner,
    "transformers_baseline": BaselineInner,
}


@dataclasses.dataclass
class Carry:
    inner_carry: dict
    steps: torch.Tensor
    halted: torch.Tensor
    current_data: dict


class ACTModel(nn.Module):
    """ACT wrapper. `exploration=(uniform [B], min_halt_draw [B])` replaces torch.rand_like /
    randint_like so both frameworks can be fed the same draws; None draws from torch's RNG."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.inner = INNERS[config.arch](config)

    @property
    def puzzle_emb(self):
        return self.inner.puzzle_emb

    def initial_carry(self, batch):
        b = batch["inputs"].shape[0]
        return Carry(
            self.inner.empty_carry(b),
            torch.zeros(b, dtype=torch.int32),
            torch.ones(b, dtype=torch.bool),
            {k: torch.zeros_like(v) for k, v in batch.items()},
        )

    def _adaptive(self):
        c = self.config
        if c.halt_max_steps <= 1:
            return False
        if c.arch == "transformers_baseline":
            return (self.training and c.act_enabled) or (not self.training and c.act_inference)
        return self.training

    def forward(self, carry, batch, exploration=None, compute_target_q=False):
        c = self.config
        new_inner = self.inner.reset_carry(carry.halted, carry.inner_carry)
        new_steps = torch.where(carry.halted, 0, carry.steps)
        new_data = {
            k: torch.where(carry.halted.view((-1,) + (1,) * (batch[k].ndim - 1)), batch[k], v)
            for k, v in carry.current_data.items()
        }
        new_inner, logits, (q_halt, q_continue) = self.inner(new_inner, new_data)
        outputs = {"logits": logits, "q_halt_logits": q_halt, "q_continue_logits": q_continue}
        with torch.no_grad():
            new_steps = new_steps + 1
            is_last = new_steps >= c.halt_max_steps
            halted = is_last
            if self._adaptive():
                hrm_rule = c.arch in ("hrm", "transformers_baseline") or not c.no_ACT_continue
                halted = halted | ((q_halt > q_continue) if hrm_rule else (q_halt > 0))
                if self.training:
                    if exploration is None:
                        u = torch.rand_like(q_halt)
                        k = torch.randint_like(new_steps, low=2, high=c.halt_max_steps + 1)
                    else:
                        u, k = exploration
                    min_halt = (u < c.halt_exploration_prob) * k
                    halted = halted & (new_steps >= min_halt)
                want = (
                    compute_target_q
                    if c.arch == "transformers_baseline"
                    else (c.arch == "hrm" or not c.no_ACT_continue)
                )
                if self.training and want:
                    # upstream TRM unpacks 5 values from this 3-tuple and crashes; fixed here
                    _, _, (nq_halt, nq_cont) = self.inner(new_inner, new_data)
                    outputs["target_q_continue"] = torch.sigmoid(
                        torch.where(is_last, nq_halt, torch.maximum(nq_halt, nq_cont))
                    )
        return Carry(new_inner, new_steps.to(torch.int32), halted, new_data), outputs


def build_model(config) -> ACTModel:
    return ACTModel(config)
