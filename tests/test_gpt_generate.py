"""Generation: greedy decoding token by token vs torch, and nanoGPT's temperature/top-k filter."""

from __future__ import annotations

import collections
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")  # the reference side: torch-free installs skip this module

from models.gpt import GPT, GPTConfig, generate, top_k_filter  # noqa: E402
from parity import gpt_torch  # noqa: E402
from parity.compare import EXACT, MASKED_EXACT, assert_close  # noqa: E402
from parity.gpt_params import from_torch  # noqa: E402

TINY = dict(block_size=16, vocab_size=65, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)


def _pair_with_sharp_weights():
    """Weights scaled up so the untrained model's greedy choice changes from step to step."""
    torch.manual_seed(0)
    tmodel = gpt_torch.GPT(gpt_torch.GPTConfig(**TINY)).double().eval()
    with torch.no_grad():
        for p in tmodel.parameters():
            if p.dim() >= 2:
                p.mul_(15.0)
    jmodel = from_torch(tmodel.state_dict(), GPTConfig(**TINY, dtype="float64"))
    jmodel.eval()
    return tmodel, jmodel


def test_greedy_decode_matches_torch_token_by_token(x64):
    tmodel, jmodel = _pair_with_sharp_weights()
    prompt = torch.tensor([[1, 5, 9, 2, 7], [3, 3, 8, 0, 11]])
    new = 20  # 5 + 20 > block_size 16: the context is cropped for the last steps
    with torch.no_grad():
        t_out = tmodel.generate(prompt, new, temperature=1.0, top_k=1)
    j_out = generate(jmodel, prompt.numpy(), new, temperature=1.0, top_k=1, rngs=nnx.Rngs(0))
    assert j_out.shape == (2, 5 + new)
    assert_close("greedy tokens", j_out, t_out, EXACT)
    assert len(np.unique(np.asarray(j_out)[:, 5:])) > 4  # a real sequence, not one repeated id


def test_top_k_filter_keeps_ties_like_nanogpt():
    logits = np.array([[3.0, 1.0, 2.0, 2.0, 0.5, 2.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]], np.float32)
    for k in (1, 2, 3, 6, 10):  # 10 > V: nanoGPT clamps k to V
        ours = top_k_filter(jnp.asarray(logits), k)
        ref = gpt_torch.top_k_filter(torch.from_numpy(logits), k)
        assert_close(f"top_k={k}", ours, ref, MASKED_EXACT)  # the filtered entries are -inf
    # k=2 on the first row: the 2nd largest is 2.0, held by three tokens -> four survive
    assert np.isfinite(np.asarray(top_k_filter(jnp.asarray(logits), 2))[0]).sum() == 4


def test_temperature_and_top_k_probabilities_match_torch():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 65)).astype(np.float32)
    for temperature, k in ((0.8, 200), (1.3, 5), (0.5, None)):
        ours = jax.nn.softmax(top_k_filter(jnp.asarray(logits) / temperature, k), axis=-1)
        ref = torch.softmax(gpt_torch.top_k_filter(torch.from_numpy(logits) / temperature, k), -1)
        np.testing.assert_allclose(np.asarray(ours), ref.numpy(), rtol=2e-6, atol=1e-7)


def test_sampling_is_seeded_and_stays_in_the_top_k(x64):
    _, jmodel = _pair_with_sharp_weights()
    prompt = np.array([[1, 2, 3]])
    a = generate(jmodel, prompt, 12, temperature=1.5, top_k=3, rngs=nnx.Rngs(sample=7))
    b = generate(jmodel, prompt, 12, temperature=1.5, top_k=3, rngs=nnx.Rngs(sample=7))
    c = generate(jmodel, prompt, 12, temperature=1.5, top_k=3, rngs=nnx.Rngs(sample=8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # 15 tokens <= block_size, so no cropping: the causal logits at t-1 chose token t, and every
    # sampled token must be among the 3 highest of them
    seq = np.asarray(a)
    logits = np.asarray(jmodel(seq, seq)[0])[0]
    for t in range(3, seq.shape[1]):
        assert seq[0, t] in np.argsort(logits[t - 1])[-3:], t


@contextlib.contextmanager
def _backend_compiles():
    """Names of the functions XLA compiles inside the block (jax.monitoring duration events)."""
    names: list[str] = []

    def listener(event, duration_secs, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            names.append(kwargs.get("fun_name", "?"))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_generate_compiles_once_not_per_length():
    """`generate` is one compiled loop over a fixed buffer and a fixed-width window, so a call
    compiles once (whatever the number of tokens, cropping included), and later calls with the
    same shapes (batch, prompt length, max_new_tokens, top_k) but other prompts, temperatures and
    keys compile nothing. nanoGPT's loop (forward on a growing context) under jit compiles once per
    length: the control shows the counter sees that. Reverting to such a loop fails here."""
    model = GPT(GPTConfig(**{**TINY, "n_layer": 1}), rngs=nnx.Rngs(0))
    model.eval()
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    new = 20  # 3 + 20 > block_size 16: lengths 4..23, the last ones cropped
    with _backend_compiles() as first:
        out = generate(model, prompt, new, temperature=1.0, top_k=5, rngs=nnx.Rngs(sample=0))
    assert out.shape == (2, 3 + new)
    per_function = collections.Counter(first)
    assert per_function["jit(_generate)"] == 1, first
    assert max(per_function.values()) == 1, f"a function compiled more than once: {first}"
    with _backend_compiles() as later:
        for i, temperature in enumerate((0.5, 1.0, 1.7)):
            generate(model, prompt + 7 * i, new, temperature=temperature, top_k=5, rngs=nnx.Rngs(i))
        generate(model, prompt[::-1], new, temperature=0.8, top_k=5, rngs=jax.random.key(3))
    assert later == [], later
    # control: a jitted forward on a growing context compiles at every length
    forward = nnx.jit(lambda m, idx: m(idx)[0])
    with _backend_compiles() as growing:
        for t in range(3, 6):
            forward(model, jnp.zeros((2, t), jnp.int32))
    assert collections.Counter(growing)["jit(<lambda>)"] == 3, growing
