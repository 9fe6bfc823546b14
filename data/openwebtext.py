"""OpenWebText-style BPE token bins, following nanoGPT's data/openwebtext recipe.

    python -m data.openwebtext --input docs/ more.jsonl --out-dir data_out/owt
    python -m data.openwebtext --hf-dataset Skylion007/openwebtext --out-dir data_out/owt  # online

Documents -> seeded shuffle and split (val = ceil(val_fraction * n) documents, nanoGPT's
train_test_split(test_size=0.0005, seed=2357)) -> tiktoken `encode_ordinary` + EOT per document ->
train.bin / val.bin (uint16, documents concatenated) + meta.json ({"encoding",
"tokenizer_vocab_size", "eot_token"}: deliberately no "vocab_size", so the model keeps nanoGPT's
padded 50304 rather than the tokenizer's 50257).

Inputs: a .txt file is one document; a folder contributes its *.txt / *.jsonl files (sorted); a
.jsonl file has one JSON object per line with a "text" field. `--hf-dataset` needs the `datasets`
package and network.

Encodings: "gpt2" is tiktoken's GPT-2 BPE (vocab 50257, EOT 50256) and needs its BPE files
(downloaded once into tiktoken's cache, or TIKTOKEN_CACHE_DIR); without them it fails with a clear
error rather than silently switching vocabulary. "bytes" is a tiktoken Encoding over the 256 raw
bytes plus EOT 256 (vocab 257): no download, used by the offline tests.

API
  get_encoding(name) -> tiktoken.Encoding
  build(inputs, out_dir, *, encoding="gpt2", val_fraction=0.0005, seed=2357, num_proc=1) -> dict
"""

from __future__ import annotations

import json
import math
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data import cli, provenance
from data.text_source import write_meta_json, write_token_bin

EOT_TEXT = "<|endoftext|>"


def get_encoding(name: str):
    import tiktoken

    if name == "bytes":
        return tiktoken.Encoding(
            name="bytes",
            pat_str=r"(?s).",  # never split words by regex: every byte is its own token anyway
            mergeable_ranks={bytes([i]): i for i in range(256)},
            special_tokens={EOT_TEXT: 256},
        )
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # tiktoken raises requests/urllib errors when its files are missing
        raise cli.BuildError(
            f"tiktoken encoding {name!r} is not available ({type(e).__name__}: {e}). It downloads "
            "its BPE files on first use: run once online, or point TIKTOKEN_CACHE_DIR at a cache "
            "that has them; offline tests use --encoding bytes."
        ) from e


class _FileDocuments:
    """Documents of .txt / .jsonl inputs, enumerated as (path, byte offset of the line) for jsonl
    or (path, None) for .txt, so a 54 GB corpus is indexed without being held in memory."""

    def __init__(self, inputs):
        files: list[Path] = []
        for inp in inputs:
            p = Path(inp)
            if p.is_dir():
                files += sorted(q for q in p.rglob("*") if q.suffix in (".txt", ".jsonl"))
            elif p.is_file():
                files.append(p)
            else:
                raise FileNotFoundError(f"input {p} does not exist")
        self.refs: list[tuple[str, int | None]] = []
        for f in files:
            if f.suffix == ".jsonl":
                with open(f, "rb") as fh:
                    offset = 0
                    for line in fh:
                        if line.strip():
                            self.refs.append((str(f), offset))
                        offset += len(line)
            else:
                self.refs.append((str(f), None))
        if not self.refs:
            raise ValueError(f"no documents found in {list(map(str, inputs))} (*.txt or *.jsonl)")

    def __len__(self) -> int:
        return len(self.refs)

    def text(self, i: int) -> str:
        path, offset = self.refs[i]
        if offset is None:
            return Path(path).read_text(encoding="utf-8")
        with open(path, "rb") as fh:
            fh.seek(offset)
            line = fh.readline()
        try:
            return json.loads(line)["text"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(
                f"{path} @ byte {offset}: expected a JSON object with 'text' ({e})"
            ) from e


class _HubDocuments:
    """A Hugging Face dataset's "text" column, read row by row (the arrow table is memory-mapped;
    materialising the column would need the whole corpus in RAM)."""

    def __init__(self, name: str):
        try:
            import datasets
        except ImportError as e:
            raise cli.BuildError("--hf-dataset needs `pip install datasets` (and network)") from e
        self.ds = datasets.load_dataset(name, split="train")

    def __len__(self) -> int:
        return len(self.ds)

    def text(self, i: int) -> str:
        return self.ds[int(i)]["text"]


_ENC = None
_DOCS = None


def _init_worker(encoding_name: str, docs) -> None:
    global _ENC, _DOCS
    _ENC, _DOCS = get_encoding(encoding_name), docs


def _tokenize(i: int) -> np.ndarray:
    ids = _ENC.encode_ordinary(_DOCS.text(i))  # special-token text in documents stays ordinary
    ids.append(_ENC.eot_token)  # nanoGPT appends EOT to each document (as a separator)
    return np.array(ids, dtype=np.uint16)


def _write_split(path: Path, docs, order, encoding: str, num_proc: int, desc: str) -> int:
    """Tokenize documents `order` (indices into docs) in that order into one bin."""

    def chunks():
        if num_proc > 1:
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(num_proc, initializer=_init_worker, initargs=(encoding, docs)) as pool:
                it = pool.imap(_tokenize, order.tolist(), chunksize=64)
                yield from tqdm(it, total=len(order), desc=desc)
        else:
            _init_worker(encoding, docs)
            for i in tqdm(order.tolist(), desc=desc):
                yield _tokenize(i)

    return write_token_bin(path, chunks())


def build(
    inputs,
    out_dir,
    *,
    encoding: str = "gpt2",
    val_fraction: float = 0.0005,
    seed: int = 2357,
    num_proc: int = 1,
    hf_dataset: str | None = None,
    built_by: dict | None = None,
) -> dict:
    t0 = time.time()
    out_dir = Path(out_dir)
    enc = get_encoding(encoding)  # fail before any work if the tokenizer is unavailable
    if enc.n_vocab > 65536:
        raise ValueError(f"encoding {encoding!r} has {enc.n_vocab} ids: too many for uint16 bins")
    if built_by is not None:  # written last: a build cut short leaves no record of it
        (out_dir / provenance.RECORD).unlink(missing_ok=True)
    docs = _HubDocuments(hf_dataset) if hf_dataset else _FileDocuments(inputs)
    n = len(docs)
    if n < 2:
        raise ValueError(f"need at least 2 documents for a train/val split, got {n}")
    n_val = min(max(1, math.ceil(val_fraction * n)), n - 1)
    order = np.random.default_rng(seed).permutation(n)
    splits = {"val": order[:n_val], "train": order[n_val:]}
    summary = {"documents": n, "encoding": encoding, "vocab_size": enc.n_vocab}
    for name, idx in splits.items():
        tokens = _write_split(out_dir / f"{name}.bin", docs, idx, encoding, num_proc, name)
        summary[f"{name}_documents"] = len(idx)
        summary[f"{name}_tokens"] = tokens
        summary[f"{name}_bytes"] = (out_dir / f"{name}.bin").stat().st_size
    # No "vocab_size" key on purpose: nanoGPT has no meta for OpenWebText and then pads GPT-2's
    # 50257 ids to 50304 (a multiple of 64); a trainer that takes vocab_size from the meta would
    # silently train a different model.
    write_meta_json(
        out_dir / "meta.json",
        {"encoding": encoding, "tokenizer_vocab_size": enc.n_vocab, "eot_token": enc.eot_token},
    )
    if built_by is not None:
        provenance.write(out_dir, built_by, ["train.bin", "val.bin", "meta.json"])
    summary["seconds"] = round(time.time() - t0, 2)
    return summary


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = cli.parser("data.openwebtext", __doc__)
    p.add_argument("--input", nargs="*", default=[], help=".txt / .jsonl files or folders")
    p.add_argument("--hf-dataset", default=None, help="e.g. Skylion007/openwebtext (online)")
    p.add_argument("--out-dir", default="data_out/openwebtext")
    p.add_argument("--encoding", default="gpt2", help="tiktoken name, or 'bytes' (offline)")
    p.add_argument("--val-fraction", type=float, default=0.0005)
    p.add_argument("--seed", type=int, default=2357)
    p.add_argument("--num-proc", type=int, default=1)
    args = p.parse_args(argv)
    if not args.input and not args.hf_dataset:
        p.error("give --input files/folders or --hf-dataset")
    summary = build(
        args.input,
        args.out_dir,
        encoding=args.encoding,
        val_fraction=args.val_fraction,
        seed=args.seed,
        num_proc=args.num_proc,
        hf_dataset=args.hf_dataset,
        built_by=provenance.record(
            "data.openwebtext",
            provenance.command_args(argv, neutral=("--num-proc",)),
            {f"input_{i}": path for i, path in enumerate(args.input)},
        ),
    )
    return cli.print_summary(summary)


if __name__ == "__main__":
    cli.run(main)
