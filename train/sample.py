"""Sample text from a GPT checkpoint: nanoGPT's sample.py for this port.

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

import argparse
import json
import os
import sys

import jax
import numpy as np
from flax import nnx

from data.text_source import read_meta
from models.gpt import GPT, PRESETS, GPTConfig, from_torch, generate
from models.state_dict import StateDictError, UnsafeCheckpointError, load_file
from train.distributed import quiet_tpu_probe

SEPARATOR = "---------------"  # nanoGPT prints this line after each sample
_META_FILES = ("meta.json", "meta.pkl")


class SampleError(ValueError):
    """Bad input to `python -m train.sample`; the message is one line naming what is wrong."""


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
    if config.get("dataset"):  # nanoGPT's sample.py: data/<dataset>/meta.pkl from its cwd
        dirs.append(os.path.join("data", str(config["dataset"])))
    return dirs


def _with_dtype(config: GPTConfig, dtype: str | None) -> GPTConfig:
    return config if dtype is None else GPTConfig(**{**vars(config), "dtype": dtype})


def load_nanogpt_ckpt(path: str, dtype: str | None = None):
    """-> (model, search dirs for the meta) from a nanoGPT ckpt.pt."""
    ckpt = load_file(path)
    args = ckpt.get("model_args") if isinstance(ckpt, dict) else None
    if not isinstance(args, dict):
        raise SampleError(
            f"{path}: no 'model_args' entry, so it is not a nanoGPT ckpt.pt (a bare state_dict "
            "does not say its architecture)"
        )
    fields = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")
    missing = [f for f in fields if f not in args]
    if missing:
        raise SampleError(f"{path}: model_args lacks {missing}")
    config = GPTConfig(**{f: args[f] for f in fields}, dtype=dtype or "float32")
    model = from_torch(ckpt, config)
    return model, [os.path.dirname(os.path.abspath(path)), *_config_dirs(ckpt.get("config"))]


def _hf_config(path: str, sd: dict) -> GPTConfig:
    """The GPT-2 architecture of an HF safetensors file: config.json beside it, else a preset."""
    keys = [k[len("transformer.") :] if k.startswith("transformer.") else k for k in sd]
    if "wte.weight" not in keys or "wpe.weight" not in keys:
        raise SampleError(f"{path}: no wte.weight / wpe.weight, so it is not a GPT-2 weights file")
    sd = {k: v for k, v in zip(keys, sd.values(), strict=True)}
    vocab, n_embd = np.shape(sd["wte.weight"])
    block = np.shape(sd["wpe.weight"])[0]
    n_layer = len({k.split(".")[1] for k in keys if k.startswith("h.")})
    cfg_json = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    if os.path.isfile(cfg_json):
        with open(cfg_json, encoding="utf-8") as f:
            n_head = int(json.load(f)["n_head"])
    else:
        match = [
            p
            for p in PRESETS.values()
            if p["n_embd"] == n_embd and p["n_layer"] == n_layer and p["bias"]
        ]
        if not match:
            raise SampleError(
                f"{path}: n_embd={n_embd}, n_layer={n_layer} is no GPT-2 size; put HF's "
                "config.json (with n_head) beside it"
            )
        n_head = match[0]["n_head"]
    return GPTConfig(
        n_layer=n_layer,
        n_head=n_head,
        n_embd=int(n_embd),
        block_size=int(block),
        vocab_size=int(vocab),
        bias=True,
        gelu_approximate=True,  # HF GPT-2's "gelu_new"
    )


def load_hf_safetensors(path: str, dtype: str | None = None):
    """-> (model, search dirs) from an HF GPT-2 .safetensors file."""
    sd = load_file(path)
    config = _with_dtype(_hf_config(path, sd), dtype)
    return from_torch(sd, config), [os.path.dirname(os.path.abspath(path))]


def _sampling_mesh_cfg(cfg):
    """The run's mesh section for one device: sampling runs one sequence at a time."""
    from omegaconf import OmegaConf  # lazy, as the other trainer imports: files need none of it

    mesh = OmegaConf.to_container(cfg.mesh)
    mesh.update(data=1, fsdp=1, tensor=1, param_sharding="replicate")
    return OmegaConf.create(mesh)


def load_run(run_dir: str, step: int | None = None, meta_path: str | None = None, dtype=None):
    """-> (model, search dirs) from a run directory of this trainer (task gpt)."""
    from etils import epath
    from omegaconf import open_dict

    from train import families
    from train import jit as jit_lib
    from train.checkpoint import Checkpointer
    from train.compose import load_run_config
    from train.mesh import make_mesh

    cfg = load_run_config((epath.Path(run_dir) / "config.yaml").read_text())
    if cfg.task != "gpt":
        raise SampleError(f"{run_dir}: a {cfg.task!r} run; train.sample samples GPT runs only")
    data_dirs = [str(cfg.data.path)] if cfg.data.get("path") else []
    meta_file = meta_path or _find_meta(data_dirs)
    if meta_file is not None:  # the run's vocab_size came from its data set's meta, as in training
        vocab = _read_meta(meta_file).get("vocab_size")
        if vocab is not None:
            with open_dict(cfg):
                cfg.model.vocab_size = int(vocab)
    mesh = make_mesh(_sampling_mesh_cfg(cfg), [jax.devices()[0]])
    task = families.make_task(cfg, mesh, need_data=False)
    ckpt = Checkpointer(epath.Path(run_dir) / "checkpoints", cfg.checkpoint)
    try:
        steps = sorted(ckpt.manager.all_steps())
        if not steps:
            raise SampleError(f"{run_dir}/checkpoints holds no checkpoint")
        step = steps[-1] if step is None else step
        if step not in steps:
            raise SampleError(f"--step {step}: {run_dir}/checkpoints holds steps {steps}")
        abstract = jit_lib.with_shardings(task.abstract_state, task.state_shardings)
        try:
            state, _ = ckpt.restore(step, abstract)
        except (ValueError, FileNotFoundError) as e:
            raise SampleError(
                f"{run_dir}: step {step} does not restore onto model {dict(cfg.model)} "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                "is the data set's meta (vocab_size) the one the run trained on? (--meta)"
            ) from e
    finally:
        ckpt.close()
    model, _ = nnx.merge(task.eval_graphdef, state)
    if dtype is not None and dtype != model.config.dtype:
        params = nnx.state(model, nnx.Param)
        model = GPT(_with_dtype(model.config, dtype), rngs=nnx.Rngs(0))
        nnx.update(model, jax.tree.map(lambda a: a.astype(model.config.param_dtype), params))
    return model, data_dirs


def source_kind(source: str) -> str:
    """'run' | 'nanogpt' | 'hf'. A missing path or an unknown kind is a one-line SampleError."""
    if not os.path.exists(source) and "://" not in source:
        raise SampleError(f"SOURCE {source}: no such file or directory")
    if "://" in source or os.path.isdir(source):
        if os.path.isdir(source) and not os.path.isfile(os.path.join(source, "config.yaml")):
            raise SampleError(
                f"SOURCE {source}: a directory without config.yaml, so not a run directory of "
                "this trainer (point at its ckpt.pt / model.safetensors for a file)"
            )
        return "run"
    if source.endswith(".safetensors"):
        return "hf"
    if source.endswith((".pt", ".pth", ".bin", ".ckpt")):
        return "nanogpt"
    raise SampleError(
        f"SOURCE {source}: unknown kind; expected a run directory, a nanoGPT ckpt.pt or an HF "
        "GPT-2 .safetensors file"
    )


def load_source(source: str, *, step=None, meta=None, dtype=None):
    """-> (model in eval mode, codec) for any SOURCE kind."""
    kind = source_kind(source)
    if kind == "run":
        model, dirs = load_run(source, step, meta, dtype)
    elif kind == "hf":
        model, dirs = load_hf_safetensors(source, dtype)
    else:
        model, dirs = load_nanogpt_ckpt(source, dtype)
    model.eval()  # dropout off, as nanoGPT's sample.py
    codec = resolve_codec(meta, dirs)
    return model, codec


# ---------------------------------------------------------------------------------------------
# Sampling


def read_start(start: str) -> str:
    """nanoGPT's --start: the text itself, or FILE:path for the contents of a file."""
    if start.startswith("FILE:"):
        path = start[len("FILE:") :]
        if not os.path.isfile(path):
            raise SampleError(f"--start FILE:{path}: no such file")
        with open(path, encoding="utf-8") as f:
            start = f.read()
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


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m train.sample",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--start", default="\n", help="prompt text, or FILE:path (default: newline)")
    p.add_argument("--num-samples", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=200, help="0 = no top-k filter")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--step", type=int, default=None, help="run directory: this checkpoint step")
    p.add_argument("--meta", default=None, help="meta.json / meta.pkl (or its folder): encoding")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float64"),
        default=None,
        help="compute dtype (default: the run's, float32 for files)",
    )
    return p


def main(argv=None) -> list[str]:
    args = _parser().parse_args(argv)
    quiet_tpu_probe()
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    try:
        start = read_start(args.start)
        model, codec = load_source(args.source, step=args.step, meta=args.meta, dtype=args.dtype)
        texts = sample(
            model,
            codec,
            start,
            num_samples=args.num_samples,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            seed=args.seed,
        )
    except (SampleError, FileNotFoundError, StateDictError, UnsafeCheckpointError) as e:
        sys.exit("train.sample: " + " ".join(line.strip() for line in str(e).splitlines()))
    for text in texts:
        print(text)
        print(SEPARATOR)
    return texts


if __name__ == "__main__":
    main()
