"""Character-level tiny-shakespeare, byte-compatible with nanoGPT's data/shakespeare_char.

    python -m data.shakespeare_char --out-dir data_out/shakespeare_char [--input input.txt]

API
  build(out_dir, *, input_path=None, url=CHAR_RNN_URL) -> dict   summary (counts, sizes, time)
  encode(text, stoi) -> np.ndarray, decode(ids, itos) -> str

Output: train.bin / val.bin (uint16, first 90% of the characters / the rest), meta.pkl (nanoGPT's
pickled {'vocab_size', 'itos', 'stoi'}, so nanoGPT's sample.py reads our folder) and meta.json (the
same data; our loader `data.text_source.read_meta` prefers it and never unpickles code).
On the char-rnn file: vocab 65, train 1,003,854 tokens, val 111,540.
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data import cli, provenance
from data.download import fetch
from data.text_source import write_meta_json, write_token_bin

CHAR_RNN_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TRAIN_FRACTION = 0.9


def download(url: str, dest: Path) -> Path:
    return fetch(url, dest, offline_hint="pass --input path/to/input.txt")


def encode(text: str, stoi: dict[str, int]) -> np.ndarray:
    return np.array([stoi[c] for c in text], dtype=np.uint16)


def decode(ids, itos: dict[int, str]) -> str:
    return "".join(itos[int(i)] for i in ids)


def build_record(input_path=None, url: str = CHAR_RNN_URL) -> dict:
    """The record (data.provenance) of a build from `input_path`, or from `url` without one."""
    return provenance.record("data.shakespeare_char", [], {"input": input_path or url})


def build(out_dir, *, input_path=None, url: str = CHAR_RNN_URL, built_by=None) -> dict:
    """`built_by`: the record written beside (build_record; main and the trainer write one)."""
    t0 = time.time()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    previous = provenance.read(out_dir) if built_by is not None else None
    if input_path is None:
        input_path = out_dir / "input.txt"
        if not input_path.exists():
            download(url, input_path)
    text = Path(input_path).read_text(encoding="utf-8")
    if not text:
        raise ValueError(f"{input_path} is empty")
    if built_by is not None:  # written last: a build cut short leaves no record of it
        (out_dir / provenance.RECORD).unlink(missing_ok=True)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    itos = dict(enumerate(chars))
    n = len(text)
    split = int(n * TRAIN_FRACTION)  # by character position, as nanoGPT
    parts = {}
    for name, piece in tqdm([("train", text[:split]), ("val", text[split:])], desc="encode"):
        parts[name] = write_token_bin(out_dir / f"{name}.bin", [encode(piece, stoi)])
    meta = {"vocab_size": len(chars), "itos": itos, "stoi": stoi}
    tmp = out_dir / f".meta.pkl.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(meta, f)
    os.replace(tmp, out_dir / "meta.pkl")
    write_meta_json(out_dir / "meta.json", {"vocab_size": len(chars), "itos": chars, "stoi": stoi})
    if built_by is not None:
        written = ["train.bin", "val.bin", "meta.pkl", "meta.json"]
        if Path(input_path) == out_dir / "input.txt":  # downloaded
            written.append("input.txt")
        for stale in set(previous["files"] if previous else ()) - {*written, provenance.RECORD}:
            (out_dir / stale).unlink(missing_ok=True)  # what the previous build wrote, not this
        provenance.write(out_dir, built_by, written)
    return {
        "input": str(input_path),
        "characters": n,
        "vocab_size": len(chars),
        "train_tokens": parts["train"],
        "val_tokens": parts["val"],
        "bytes": {f: (out_dir / f).stat().st_size for f in ("train.bin", "val.bin", "meta.pkl")},
        "seconds": round(time.time() - t0, 2),
    }


def main(argv=None) -> dict:
    p = cli.parser("data.shakespeare_char", __doc__)
    p.add_argument("--out-dir", default="data_out/shakespeare_char")
    p.add_argument("--input", default=None, help="local input.txt (default: download it)")
    p.add_argument("--url", default=CHAR_RNN_URL)
    args = p.parse_args(argv)
    summary = build(
        args.out_dir,
        input_path=args.input,
        url=args.url,
        built_by=build_record(args.input, args.url),
    )
    return cli.print_summary(summary)


if __name__ == "__main__":
    cli.run(main)
