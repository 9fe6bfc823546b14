"""PyTorch reference implementations of nanoGPT and TRM, and the parity toolkit that compares any
torch module with its Flax NNX port (docs/porting_your_model.md):

- capture.py: every module's inputs and outputs on both sides, gradients, state after the call;
- keymap.py: a torch state_dict into an NNX model by rule, and back, with a report;
- check.py: per-module comparison and the first divergent module;
- diff.py: `python -m parity diff TORCH_FACTORY NNX_FACTORY`;
- promote.py: a reference's own float32 casts run in float64 in a float64 run;
- steps.py: torch.optim and optax steps side by side;
- goldens/module.py: goldens of any torch module, checked without torch;
- compare.py, envelope.py: named bounds and the one-ulp envelope;
- machine.py: the kernels torch runs here, and whether they give a fixture's bits.

The references and reports import torch; the toolkit modules import it only inside the functions
that run torch, so checking a port against recorded goldens needs JAX alone. Nothing in models/,
train/ or data/ imports this package at module level.
"""
