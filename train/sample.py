"""Generate from a checkpoint: `python -m train.sample SOURCE [--step N] [options]`.

    python -m train.sample runs/gpt_shakespeare_char --start "ROMEO:" --num-samples 3
    python -m train.sample out-shakespeare-char/ckpt.pt --start FILE:prompt.txt --top-k 50
    python -m train.sample gpt2/model.safetensors --start "Hello, I'm a language model,"

SOURCE is a run directory of this trainer (its latest checkpoint, or --step N) or a weights file
of a family's original code base, opened by train.source.open_source on one device. SOURCE's
family generates, through its Sampler (train/task.py), and takes its own options (train/cli.py);
`--help` lists them family by family: GPT's are nanoGPT's sample.py's
(train/families/gpt/sample.py). Each sample is printed followed by nanoGPT's separator line.
"""

from __future__ import annotations

from parity.files import UnsafeCheckpointError
from parity.state_dict import StateDictError
from train import families, gcs
from train.cli import FamilyCommand
from train.errors import ConfigError, exit_with
from train.runtime import quiet_tpu_probe
from train.source import open_source, source_family

SEPARATOR = "---------------"  # nanoGPT prints this line after each sample


class SampleError(ConfigError):
    """Bad input to `python -m train.sample`; the message is one line naming what is wrong."""


def _add_common(p) -> None:
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--step", type=int, default=None, help="run directory: this checkpoint step")


COMMAND = FamilyCommand("python -m train.sample", __doc__, _add_common, lambda f: f.sampler)


def main(argv=None) -> list[str]:
    gcs.configure()  # STORAGE_EMULATOR_HOST set: every gs:// client goes to that server
    quiet_tpu_probe()
    try:
        args, fam, _ = COMMAND.parse(argv, source_family)
        if fam.sampler is None:
            samplers = [n for n, f in families.registered().items() if f.sampler is not None]
            raise SampleError(
                f"{args.source}: its model family has no sampler; train.sample samples "
                f"{' or '.join(samplers)} runs only"
            )
        fam.sampler.prepare(args)
        kinds = ("run", *fam.sampler.kinds)
        src = open_source(args.source, step=args.step, single_device=True, kinds=kinds)
        texts = fam.sampler.sample(src, args)
    except (ConfigError, FileNotFoundError, StateDictError, UnsafeCheckpointError) as e:
        exit_with(e)
    for text in texts:
        print(text)
        print(SEPARATOR)
    return texts


if __name__ == "__main__":
    main()
