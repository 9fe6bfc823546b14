"""PyTorch reference implementations of nanoGPT and TRM, and the tools that compare them to the
Flax NNX ports in models/. Everything here may import torch; nothing in models/, train/ or data/
imports this package at module level."""
