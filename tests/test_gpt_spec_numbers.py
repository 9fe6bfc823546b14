"""nanoGPT's numbers, worked by hand from its formulas: parameter counts, FLOPs per token, MFU, get_lr, crop_block_size."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference side: torch-free installs skip this module

from models.gpt import GPTConfig, abstract_gpt, get_lr, preset  # noqa: E402
from models.gpt.flops import gpt_flops_per_token as flops_per_token  # noqa: E402
from models.gpt.training import lr_schedule  # noqa: E402
from parity import gpt_torch, report_gpt  # noqa: E402
from parity.compare import FLOAT32, FLOAT64, assert_close  # noqa: E402
from train.families.gpt.mfu import estimate_mfu  # noqa: E402
from train.flops import peak_flops_for  # noqa: E402

# nanoGPT's get_num_params: (non-embedding, total) parameters
COUNTS = {
    "shakespeare_char": (10_646_784, 10_745_088),
    "gpt2": (123_653_376, 124_439_808),
    "gpt2-124m-owt": (123_587_328, 124_373_760),
}
FLOPS_PER_TOKEN = {
    "shakespeare_char": 70_958_592,
    "gpt2": 855_166_464,
    "gpt2-124m-owt": 854_770_176,
}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_parameter_counts_match_spec_table(name):
    cfg = preset(name)
    abstract = abstract_gpt(cfg)  # shapes only, no memory
    assert (abstract.get_num_params(), abstract.get_num_params(non_embedding=False)) == COUNTS[name]


@pytest.mark.parametrize("name", sorted(FLOPS_PER_TOKEN))
def test_flops_per_token_match_spec(name):
    assert flops_per_token(preset(name)) == FLOPS_PER_TOKEN[name]


def test_estimate_mfu_matches_torch_reference_and_presets():
    cfg = dict(block_size=16, vocab_size=65, n_layer=2, n_head=2, n_embd=32, bias=False)
    torch.manual_seed(0)
    ref = gpt_torch.GPT(gpt_torch.GPTConfig(**cfg)).estimate_mfu(fwdbwd_per_iter=12, dt=0.25)
    ours = estimate_mfu(GPTConfig(**cfg), 12, 0.25)
    assert ours == pytest.approx(ref, rel=1e-15)
    # shakespeare_char: 64 sequences of 256 per iteration at 100 ms on one A100
    mfu = estimate_mfu(preset("shakespeare_char"), 64, 0.1, "A100")
    assert mfu == pytest.approx(70_958_592 * 256 * 64 / 0.1 / 312e12, rel=1e-15)
    assert estimate_mfu(preset("shakespeare_char"), 64, 0.1, "H100") == pytest.approx(
        mfu * 312e12 / 989e12, rel=1e-15
    )
    assert peak_flops_for("TPUv4") == 275e12
    assert estimate_mfu(preset("shakespeare_char"), 64, 0.1, 1e15) == pytest.approx(
        mfu * 312e12 / 1e15, rel=1e-15
    )


LR = dict(
    learning_rate=1e-3, warmup_iters=100, lr_decay_iters=5000, min_lr=1e-4
)  # shakespeare_char


@pytest.mark.parametrize("it", [0, 1, 99, 100, 101, 2550, 4999, 5000, 5001, 6000])
def test_get_lr_boundaries_match_nanogpt(it, x64):
    ref = gpt_torch.get_lr(it, **LR)
    assert get_lr(it, **LR) == ref  # python path: the same double arithmetic
    traced = jax.jit(lr_schedule(**LR))(jnp.asarray(it, jnp.int32))  # what optax calls
    assert_close(f"get_lr({it}) under jit", traced, ref, FLOAT64)


def test_get_lr_formula_values():
    assert get_lr(0, **LR) == pytest.approx(1e-3 / 101)  # (it+1)/(warmup+1): never 0
    assert get_lr(100, **LR) == pytest.approx(1e-3)
    assert get_lr(5000, **LR) == pytest.approx(1e-4)
    assert get_lr(2550, **LR) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 9e-4)


def test_crop_block_size_matches_torch():
    cfg = dict(block_size=16, vocab_size=65, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)
    tmodel, jmodel = report_gpt.build_pair(cfg, "float32", flash=False)  # manual: buffers too
    tmodel.crop_block_size(8)
    jmodel.crop_block_size(8)
    assert jmodel.config.block_size == 8 and jmodel.wpe.embedding[...].shape == (8, 32)
    assert tmodel.transformer.h[0].attn.bias.shape == (1, 1, 8, 8)
    idx, targets = report_gpt.batch({**cfg, "block_size": 8})
    with torch.no_grad():
        t_logits = tmodel(idx, targets)[0]
    assert_close(
        "logits after crop",
        jmodel(jnp.asarray(idx.numpy()), jnp.asarray(targets.numpy()))[0],
        t_logits,
        FLOAT32,
    )
    with pytest.raises(ValueError, match="new block_size 12 > current 8"):
        jmodel.crop_block_size(12)
    with pytest.raises(ValueError, match="block size is only 8"):
        jmodel(jnp.zeros((1, 9), jnp.int32))
    assert np.asarray(jmodel.wpe.embedding[...]).dtype == np.float32
