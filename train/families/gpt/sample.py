"""GPT's part of `python -m train.sample`: nanoGPT's sample.py for this port.

    python -m train.sample runs/gpt_shakespeare_char --start "ROMEO:" --num-samples 3
    python -m train.sample out-shakespeare-char/ckpt.pt --start FILE:prompt.txt --top-k 50
    python -m train.sample gpt2/model.safetensors --start "Hello, I'm a language model,"

SOURCE is one of
  - a run directory of this trainer (task gpt): its latest checkpoint (`--step N` for another);
  - a nanoGPT `ckpt.pt` (its `model_args` give the architecture; `_orig_mod.` keys are fine),
    including the ones `python -m train.export` writes;
  - an HF GPT-2 `.safetensors` file (Conv1D layout, tanh GELU); the architecture comes from the
    `config.json` beside it, or from the GPT-2 preset with the file's width and depth.

The encoding is nanoGPT's rule: a character-level vocabulary when the data set's meta (meta.json,
or a data-only meta.pkl: never unpickled as code) is found, else GPT-2 BPE (tiktoken). The meta is
looked for in `--meta PATH`, then beside a checkpoint file, then in the data directory the
checkpoint's config names (`data.path` for this trainer, nanoGPT's `data/<dataset>/`). A meta
with an "encoding" (data.openwebtext) selects that tiktoken encoding.

Sampling is nanoGPT's: logits / temperature, top-k, one categorical draw per token, starting from
`--start` (text, or FILE:path for a file's contents). Sample i uses the key fold_in(key(seed), i)
and one jitted `models.gpt.generate` call, so it does not depend on --num-samples and all samples
share one compilation. `--temperature 0` is greedy decoding (top-k 1). `--top-k 0` turns the filter
off. The device is whatever JAX picks (CPU, GPU or TPU); there is no --device.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from flax import nnx

from data.text_source import read_meta
from models.gpt import GPT, GPTConfig, generate
from train.errors import one_line
from train.families.gpt.task import GPTTask
from train.sample import SampleError
from train.source import open_source
from train.task import Sampler

_META_FILES = ("meta.json", "meta.pkl")

# ---------------------------------------------------------------------------------------------
# Encodings


class CharCodec:
    """A character-level vocabulary (data.shakespeare_char's meta)."""

    def __init__(self, meta: dict, where: str):
        self.stoi = {str(k): int(v) for k, v in meta["stoi"].items()}
        self.itos = {int(k): str(v) for k, v in meta["itos"].items()}
        self.where = where
        self.name = f"char ({len(self.stoi)} characters, {where})"

    def encode(self, text: str) -> list[int]:
        for i, c in enumerate(text):
            if c not in self.stoi:
                raise SampleError(
                    f"--start: character {c!r} (U+{ord(c):04X}) at position {i} is not in the "
                    f"vocabulary of {self.where} ({len(self.stoi)} characters)"
                )
        return [self.stoi[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.itos.get(int(i), "\ufffd") for i in ids)


class BPECodec:
    """A tiktoken encoding (GPT-2 BPE by default), nanoGPT's allowed special token included."""

    def __init__(self, name: str = "gpt2"):
        from data.openwebtext import EOT_TEXT, get_encoding

        try:
            self.enc = get_encoding(name)
        except ImportError as e:  # tiktoken, an optional package
            raise SampleError(
                "no meta.json / meta.pkl was found for this checkpoint, so the encoding is GPT-2 "
                "BPE (as in nanoGPT), which needs tiktoken: pip install tiktoken (or pass a "
                "character-level data set's meta with --meta)"
            ) from e
        except RuntimeError as e:  # GPT-2's BPE files are downloaded on first use
            raise SampleError(
                f"{e} (no meta.json / meta.pkl was found for this checkpoint, so the encoding is "
                "GPT-2 BPE, as in nanoGPT; a character-level data set's meta goes in --meta)"
            ) from e
        self.allowed = {EOT_TEXT} & set(self.enc.special_tokens_set)
        self.name = f"BPE (tiktoken {name!r})"

    def encode(self, text: str) -> list[int]:
        return self.enc.encode(text, allowed_special=self.allowed)

    def decode(self, ids) -> str:
        return self.enc.decode([int(i) for i in ids])


def codec_from_meta(meta: dict, where: str):
    if "stoi" in meta and "itos" in meta:
        return CharCodec(meta, where)
    if "encoding" in meta:
        return BPECodec(str(meta["encoding"]))
    raise SampleError(f"{where}: neither a character vocabulary (stoi/itos) nor an 'encoding'")


def _find_meta(dirs) -> str | None:
    for d in dirs:
        if d and os.path.isdir(d):
            for name in _META_FILES:
                if os.path.isfile(os.path.join(d, name)):
                    return os.path.join(d, name)
    return None


def _read_meta(path: str) -> dict:
    try:
        return read_meta(path)
    except FileNotFoundError as e:
        raise SampleError(f"--meta: {path} not found (a meta.json, meta.pkl or a folder)") from e
    except (OSError, ValueError) as e:  # not JSON, a pickle that asks for code, wrong fields
        raise SampleError(one_line(e)) from e


def resolve_codec(meta_path: str | None, search_dirs=()):
    """--meta, else the first meta.json/meta.pkl in `search_dirs`, else GPT-2 BPE (as nanoGPT)."""
    path = meta_path or _find_meta(search_dirs)
    if path is None:
        return BPECodec("gpt2")
    return codec_from_meta(_read_meta(path), path)


# ---------------------------------------------------------------------------------------------
# Sources


def _config_dirs(config) -> list[str]:
    """Data directories a checkpoint's saved config names: ours (data.path), nanoGPT's dataset."""
    if not isinstance(config, dict):
        return []
    dirs = []
    data = config.get("data")
    if isinstance(data, dict) and data.get("path"):
        dirs.append(str(data["path"]))
    dataset = str(config.get("dataset") or "")
    if dataset and dataset not in (".", "..") and not set("/\\") & set(dataset):
        dirs.append(os.path.join("data", dataset))  # nanoGPT's sample.py: data/<dataset>/meta.pkl
    return dirs


def _meta_dirs(src) -> list[str]:
    """Where the encoding's meta is looked for: beside a checkpoint file, then the data
    directory its config names (a run: data.path)."""
    if src.kind == "run":
        return [str(src.cfg.data.path)] if src.cfg.data.get("path") else []
    return [os.path.dirname(os.path.abspath(src.path)), *_config_dirs(src.meta.get("config"))]


def with_dtype(model: GPT, dtype: str | None) -> GPT:
    """`model` computing in `dtype` (float64 means float64 parameters too): the same weights."""
    if dtype is None or dtype == model.config.dtype:
        return model
    config = GPTConfig(**{**vars(model.config), "dtype": dtype})
    params = nnx.state(model, nnx.Param)
    out = GPT(config, rngs=nnx.Rngs(0))
    nnx.update(out, jax.tree.map(lambda a: a.astype(config.param_dtype), params))
    return out


def load_source(source: str, *, step=None, meta=None, dtype=None):
    """-> (model in eval mode, codec) for a GPT SOURCE (train.source.open_source, one device)."""
    src = open_source(source, step=step, single_device=True, kinds=("run", *GPTSampler.kinds))
    return load_model(src, meta=meta, dtype=dtype)


def load_model(src, *, meta=None, dtype=None):
    """-> (model in eval mode, codec) of an opened GPT train.source.Source."""
    if not isinstance(src.task, GPTTask):
        raise SampleError(f"{src.path}: a {src.cfg.family!r} run; this samples GPT runs only")
    codec = resolve_codec(meta, _meta_dirs(src))
    vocab = src.task.model_cfg.vocab_size
    if isinstance(codec, CharCodec) and len(codec.stoi) != vocab:
        raise SampleError(
            f"{codec.where}: vocab_size={len(codec.stoi)}, but the model of {src.path} has "
            f"vocab_size={vocab}; give the meta of the data set it was trained on (--meta)"
        )
    model, _ = nnx.merge(src.task.eval_graphdef, src.state)
    model = with_dtype(model, dtype)
    model.eval()  # dropout off, as nanoGPT's sample.py
    return model, codec


# ---------------------------------------------------------------------------------------------
# Sampling


def read_start(start: str) -> str:
    """nanoGPT's --start: the text itself, or FILE:path for the contents of a file."""
    if start.startswith("FILE:"):
        path = start[len("FILE:") :]
        if not os.path.isfile(path):
            raise SampleError(f"--start FILE:{path}: no such file")
        try:
            with open(path, encoding="utf-8") as f:
                start = f.read()
        except UnicodeDecodeError as e:
            raise SampleError(
                f"--start FILE:{path}: not UTF-8 text ({e.reason} at byte {e.start})"
            ) from e
    return start


def sample(
    model: GPT,
    codec,
    start: str,
    *,
    num_samples: int = 10,
    max_new_tokens: int = 500,
    temperature: float = 0.8,
    top_k: int | None = 200,
    seed: int = 1337,
) -> list[str]:
    """num_samples continuations of `start` (decoded, prompt included, as nanoGPT prints them)."""
    if temperature < 0:
        raise SampleError(f"--temperature must be >= 0, got {temperature}")
    if max_new_tokens < 0 or num_samples < 1:
        raise SampleError("--max-new-tokens must be >= 0 and --num-samples >= 1")
    ids = codec.encode(start)
    if not ids:
        raise SampleError("--start encodes to no token; give at least one character")
    vocab = model.config.vocab_size
    if max(ids) >= vocab:
        raise SampleError(f"--start: token id {max(ids)} is outside the model's vocab_size {vocab}")
    if temperature == 0:  # greedy: nanoGPT would divide by zero
        temperature, top_k = 1.0, 1
    top_k = None if not top_k or top_k <= 0 else int(top_k)
    idx = np.asarray([ids], np.int32)
    key = jax.random.key(seed)
    out = []
    for i in range(num_samples):
        y = generate(
            model,
            idx,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            rngs=jax.random.fold_in(key, i),
        )
        out.append(codec.decode(np.asarray(jax.device_get(y))[0].tolist()))
    return out


class GPTSampler(Sampler):
    """nanoGPT's sample.py (train/families/gpt/sample.py): --start, --num-samples,
    --max-new-tokens, --temperature, --top-k, --seed, --meta (the encoding), --dtype."""

    kinds = ("nanogpt", "hf_gpt2")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--start", default="\n",
                            help="prompt text, or FILE:path (default: newline)")  # fmt: skip
        parser.add_argument("--num-samples", type=int, default=10)
        parser.add_argument("--max-new-tokens", type=int, default=500)
        parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
        parser.add_argument("--top-k", type=int, default=200, help="0 = no top-k filter")
        parser.add_argument("--seed", type=int, default=1337)
        parser.add_argument("--meta", default=None,
                            help="meta.json / meta.pkl (or its folder): encoding")  # fmt: skip
        parser.add_argument(
            "--dtype",
            choices=("float32", "bfloat16", "float64"),
            default=None,
            help="compute dtype (default: the run's, float32 for files)",
        )

    def prepare(self, args) -> None:
        if args.dtype == "float64":
            jax.config.update("jax_enable_x64", True)

    def sample(self, src, args) -> list[str]:
        start = read_start(args.start)
        model, codec = load_model(src, meta=args.meta, dtype=args.dtype)
        return sample(
            model,
            codec,
            start,
            num_samples=args.num_samples,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            seed=args.seed,
        )
