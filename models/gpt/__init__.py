"""nanoGPT (karpathy/nanoGPT) in Flax NNX, with nanoGPT's optimisation math.

    from models.gpt import GPT, GPTConfig, generate, preset
    model = GPT(preset("shakespeare_char"), rngs=nnx.Rngs(0))   # nanoGPT's init
    model.eval()
    tokens = generate(model, idx, 100, temperature=0.8, top_k=200, rngs=nnx.Rngs(sample=0))

nanoGPT's checkpoints load through the key map beside the toolkit (parity/gpt_params.py:
`from_torch_file("out-shakespeare-char/ckpt.pt")`): this package imports only the JAX stack.
Parity with our PyTorch nanoGPT (parity/gpt_torch.py) is proven by tests/test_gpt_*.py; the
chapter docs/porting_nanogpt.md lists each construct and its test.
"""

from models.gpt.modeling import (
    GPT,
    MLP,
    PRESETS,
    Block,
    CausalSelfAttention,
    GPTConfig,
    abstract_gpt,
    cross_entropy,
    generate,
    preset,
    top_k_filter,
)
from models.gpt.training import (
    clip_by_global_norm,
    configure_optimizers,
    decay_mask,
    get_lr,
    loss_and_grads,
    train_step,
)

__all__ = [
    "GPT",
    "abstract_gpt",
    "GPTConfig",
    "PRESETS",
    "Block",
    "CausalSelfAttention",
    "MLP",
    "clip_by_global_norm",
    "configure_optimizers",
    "cross_entropy",
    "decay_mask",
    "generate",
    "get_lr",
    "loss_and_grads",
    "preset",
    "top_k_filter",
    "train_step",
]
