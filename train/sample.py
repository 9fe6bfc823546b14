"""Generate from a checkpoint: `python -m train.sample SOURCE [--step N] [options]`.

    python -m train.sample runs/gpt_shakespeare_char --start "ROMEO:" --num-samples 3
    python -m train.sample out-shakespeare-char/ckpt.pt --start FILE:prompt.txt --top-k 50
    python -m train.sample gpt2/model.safetensors --start "Hello, I'm a language model,"

SOURCE is a run directory of this trainer (its latest checkpoint, or --step N) or a weights file
of a family's original code base, opened by train.source.open_source on one device. The family of
SOURCE generates, through its Sampler (train/task.py), and its options are listed below by family:
GPT's is nanoGPT's sample.py (train/families/gpt/sample.py). Each sample is printed followed by
nanoGPT's separator line.
"""

from __future__ import annotations

import argparse
import inspect

from models.state_dict import StateDictError, UnsafeCheckpointError
from train import families, gcs
from train.distributed import quiet_tpu_probe
from train.errors import ConfigError, exit_with
from train.source import open_source

SEPARATOR = "---------------"  # nanoGPT prints this line after each sample


class SampleError(ConfigError):
    """Bad input to `python -m train.sample`; the message is one line naming what is wrong."""


def _parser(samplers: dict) -> argparse.ArgumentParser:
    docs = [f"{name}: {inspect.getdoc(inspect.getmodule(s))}" for name, s in samplers.items()]
    p = argparse.ArgumentParser(
        prog="python -m train.sample",
        description="\n\n".join([__doc__, *docs]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--step", type=int, default=None, help="run directory: this checkpoint step")
    for name, sampler in samplers.items():
        sampler.add_arguments(p.add_argument_group(f"{name} options"))
    return p


def main(argv=None) -> list[str]:
    gcs.configure()  # STORAGE_EMULATOR_HOST set: every gs:// client goes to that server
    samplers = {n: f.sampler for n, f in families.registered().items() if f.sampler is not None}
    args = _parser(samplers).parse_args(argv)
    quiet_tpu_probe()
    try:
        for sampler in samplers.values():
            sampler.prepare(args)
        kinds = ("run", *(k for s in samplers.values() for k in s.kinds))
        src = open_source(args.source, step=args.step, single_device=True, kinds=kinds)
        sampler = families.family(src.cfg.task).sampler
        if sampler is None:
            raise SampleError(
                f"{args.source}: a {src.cfg.task!r} run; train.sample samples "
                f"{' or '.join(sorted(samplers))} runs only"
            )
        texts = sampler.sample(src, args)
    except (ConfigError, FileNotFoundError, StateDictError, UnsafeCheckpointError) as e:
        exit_with(e, prefix="train.sample: ")
    for text in texts:
        print(text)
        print(SEPARATOR)
    return texts


if __name__ == "__main__":
    main()
