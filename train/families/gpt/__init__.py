"""nanoGPT on the trainer: nanoGPT's train.py for models/gpt/ (docs/architecture.md, "Adding a
model family").

    task.py      GPTTask: config checks, state (model + AdamW), steps, estimate_loss, weights in
                 and out
    data.py      the `data` section, building shakespeare_char, the checks that a data set fits
    evaluate.py  its part of `python -m train.evaluate` (estimate_loss on --data)
    weights.py   nanoGPT ckpt.pt and HF GPT-2 .safetensors files for train.source
    sample.py    its part of `python -m train.sample` (nanoGPT's sample.py)
    mfu.py       nanoGPT's estimate_mfu
"""

from train.families.gpt.evaluate import GPTEvaluation
from train.families.gpt.sample import GPTSampler
from train.families.gpt.task import GPTTask
from train.families.gpt.weights import HFGPT2File, NanoGPTCheckpoint
from train.task import Family

FAMILY = Family(
    task=GPTTask,
    evaluation=GPTEvaluation(),
    weights_files=(HFGPT2File(), NanoGPTCheckpoint()),  # in this order: a .safetensors first
    sampler=GPTSampler(),
)
