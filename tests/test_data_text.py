"""Text pipelines: nanoGPT-compatible char/BPE bins and the Grain window source."""

from __future__ import annotations

import json
import math
import os
import pickle

import numpy as np
import pytest

from data import openwebtext, shakespeare_char
from data.text_source import (
    TokenWindows,
    UnsafePickleError,
    eval_dataset,
    read_meta,
    read_token_bin,
    train_dataset,
    write_token_bin,
)


def test_shakespeare_char_matches_nanogpt_counts(shared_data_dir, tmp_path):
    src = os.path.join(shared_data_dir, "tinyshakespeare", "input.txt")
    summary = shakespeare_char.main(["--input", src, "--out-dir", str(tmp_path)])
    # nanoGPT's prepare.py prints exactly these for the char-rnn file.
    assert summary["vocab_size"] == 65
    assert summary["train_tokens"] == 1_003_854
    assert summary["val_tokens"] == 111_540
    train, val = read_token_bin(tmp_path / "train.bin"), read_token_bin(tmp_path / "val.bin")
    assert train.dtype == np.uint16 and train.shape == (1_003_854,)
    meta_pkl, meta_json = read_meta(tmp_path / "meta.pkl"), read_meta(tmp_path / "meta.json")
    assert meta_pkl == meta_json
    assert "".join(meta_pkl["itos"][i] for i in range(13)) == "\n !$&',-.3:;?"
    text = open(src, encoding="utf-8").read()
    assert shakespeare_char.decode(train, meta_pkl["itos"]) == text[:1_003_854]
    assert shakespeare_char.decode(val, meta_pkl["itos"]) == text[1_003_854:]


def test_meta_pkl_loader_refuses_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    bad = tmp_path / "meta.pkl"
    bad.write_bytes(pickle.dumps({"vocab_size": 3, "itos": {0: "a"}, "x": Evil()}))
    with pytest.raises(UnsafePickleError, match="system"):
        read_meta(bad)
    good = tmp_path / "good" / "meta.pkl"
    good.parent.mkdir()
    good.write_bytes(pickle.dumps({"vocab_size": 2, "itos": {0: "a", 1: "b"}, "stoi": {"a": 0}}))
    assert read_meta(good.parent)["itos"] == {0: "a", 1: "b"}


def test_write_token_bin_rejects_out_of_range_and_leaves_nothing(tmp_path):
    path = tmp_path / "x.bin"
    with pytest.raises(ValueError, match="65535"):
        write_token_bin(path, [np.arange(10), np.array([70000])])
    assert list(tmp_path.iterdir()) == []


def _tiny_corpus(root):
    docs = [f"document {i}: " + "héllo wörld " * (i + 1) for i in range(12)]
    (root / "txt").mkdir()
    for i, d in enumerate(docs[:5]):
        (root / "txt" / f"{i:02d}.txt").write_text(d, encoding="utf-8")
    with open(root / "rest.jsonl", "w", encoding="utf-8") as f:
        for d in docs[5:]:
            f.write(json.dumps({"text": d}) + "\n")
    return docs


def test_openwebtext_bytes_pipeline_on_tiny_corpus(tmp_path):
    docs = _tiny_corpus(tmp_path)
    inputs = [str(tmp_path / "txt"), str(tmp_path / "rest.jsonl")]
    s = openwebtext.main(
        [
            "--input",
            *inputs,
            "--out-dir",
            str(tmp_path / "a"),
            "--encoding",
            "bytes",
            "--val-fraction",
            "0.2",
        ]
    )
    assert s["val_documents"] == math.ceil(0.2 * 12) and s["train_documents"] == 12 - 3
    train = np.asarray(read_token_bin(tmp_path / "a" / "train.bin"))
    val = np.asarray(read_token_bin(tmp_path / "a" / "val.bin"))
    assert len(train) + len(val) == sum(len(d.encode()) + 1 for d in docs)
    # Every document comes back exactly once, each followed by one EOT.
    got = []
    for arr in (train, val):
        ends = np.flatnonzero(arr == 256)
        assert ends[-1] == len(arr) - 1
        for a, b in zip(np.r_[-1, ends[:-1]], ends):
            got.append(bytes(arr[a + 1 : b].astype(np.uint8)).decode())
    assert sorted(got) == sorted(docs)
    meta = read_meta(tmp_path / "a")
    assert meta["tokenizer_vocab_size"] == 257 and meta["eot_token"] == 256
    assert "vocab_size" not in meta  # the model keeps nanoGPT's padded vocabulary
    # Seeded: same seed -> identical bins, another seed -> another split.
    openwebtext.build(inputs, tmp_path / "b", encoding="bytes", val_fraction=0.2)
    assert (tmp_path / "b" / "train.bin").read_bytes() == (
        tmp_path / "a" / "train.bin"
    ).read_bytes()
    openwebtext.build(inputs, tmp_path / "c", encoding="bytes", val_fraction=0.2, seed=1)
    assert (tmp_path / "c" / "val.bin").read_bytes() != (tmp_path / "a" / "val.bin").read_bytes()


def test_gpt2_encoding_or_clear_offline_error():
    try:
        enc = openwebtext.get_encoding("gpt2")
    except RuntimeError as e:  # offline without a tiktoken cache: must say how to fix it
        assert "TIKTOKEN_CACHE_DIR" in str(e) and "bytes" in str(e)
    else:
        assert enc.encode_ordinary("hello world") == [31373, 995] and enc.eot_token == 50256


@pytest.fixture
def token_bin(tmp_path):
    path = tmp_path / "t.bin"
    write_token_bin(path, [np.random.default_rng(0).integers(0, 500, size=5000)])
    return path


def test_windows_are_shifted_by_one(token_bin):
    src = TokenWindows(token_bin, block_size=16)
    tokens = np.asarray(read_token_bin(token_bin))
    assert len(src) == 5000 - 16
    rec = src[123]
    np.testing.assert_array_equal(rec["x"], tokens[123:139])
    np.testing.assert_array_equal(rec["y"], tokens[124:140])
    batch = next(
        iter(
            train_dataset(
                token_bin,
                block_size=16,
                global_batch_size=4,
                seed=0,
                process_index=0,
                process_count=1,
            )
        )
    )
    assert batch["x"].shape == (4, 16) and batch["x"].dtype == np.int32
    np.testing.assert_array_equal(batch["x"][:, 1:], batch["y"][:, :-1])
    with pytest.raises(IndexError):
        src[len(src)]
    pickle.loads(pickle.dumps(src))[0]  # picklable for Grain worker processes


def test_resume_mid_stream_gives_same_next_batches(token_bin):
    ds = train_dataset(
        token_bin, block_size=8, global_batch_size=4, seed=7, process_index=0, process_count=1
    )
    it = iter(ds)
    for _ in range(3):
        next(it)
    state = it.get_state()
    expect = [next(it) for _ in range(3)]
    fresh = iter(
        train_dataset(
            token_bin, block_size=8, global_batch_size=4, seed=7, process_index=0, process_count=1
        )
    )
    fresh.set_state(json.loads(json.dumps(state)))  # state survives a JSON round trip
    for e in expect:
        got = next(fresh)
        np.testing.assert_array_equal(got["x"], e["x"])
        np.testing.assert_array_equal(got["y"], e["y"])
    other = next(
        iter(
            train_dataset(
                token_bin,
                block_size=8,
                global_batch_size=4,
                seed=8,
                process_index=0,
                process_count=1,
            )
        )
    )
    assert not np.array_equal(other["x"], expect[0]["x"])


@pytest.mark.parametrize("make", [train_dataset, eval_dataset])
def test_process_shards_cover_global_batch_exactly_once(token_bin, make):
    kw = dict(block_size=8, global_batch_size=8)
    if make is eval_dataset:
        kw["num_batches"] = 3
    else:
        kw["seed"] = 3
    whole = [
        b["x"] for _, b in zip(range(3), make(token_bin, process_index=0, process_count=1, **kw))
    ]
    parts = [
        [b["x"] for _, b in zip(range(3), make(token_bin, process_index=p, process_count=4, **kw))]
        for p in range(4)
    ]
    for i in range(3):
        assert all(part[i].shape == (2, 8) for part in parts)
        np.testing.assert_array_equal(np.concatenate([part[i] for part in parts]), whole[i])
    with pytest.raises(ValueError, match="divisible"):
        make(token_bin, process_index=0, process_count=3, **kw)


def test_eval_dataset_is_fixed_and_finite(token_bin):
    ds = eval_dataset(
        token_bin,
        block_size=8,
        global_batch_size=4,
        num_batches=5,
        process_index=0,
        process_count=1,
    )
    a, b = list(ds), list(ds)
    assert len(a) == 5
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["x"], y["x"])


def test_shakespeare_download_path_through_a_file_url(tmp_path):
    (tmp_path / "src.txt").write_text("to be or not to be\n" * 10)
    s = shakespeare_char.build(tmp_path / "out", url=f"file://{tmp_path}/src.txt")
    assert s["vocab_size"] == len(set("to be or not to be\n"))
    assert s["train_tokens"] == int(0.9 * 190) and s["val_tokens"] == 190 - int(0.9 * 190)
    with pytest.raises(RuntimeError, match="offline"):
        shakespeare_char.build(tmp_path / "out2", url=f"file://{tmp_path}/missing.txt")


def test_synthetic_text_is_the_same_everywhere(tmp_path):
    """tests.helpers.synthetic_text stands in for tiny-shakespeare in the trainer and bench tests;
    its hash is pinned so every clone trains on the same characters."""
    import hashlib

    from tests.helpers import build_tiny_text, synthetic_text

    text = synthetic_text()
    assert len(text) == 60_000 and len(set(text)) == 47
    assert hashlib.sha256(text.encode()).hexdigest()[:12] == "370a45d79e9d"
    assert synthetic_text(seed=1) != text
    build_tiny_text(str(tmp_path / "d"))
    assert read_meta(tmp_path / "d")["vocab_size"] == 47
    assert len(read_token_bin(tmp_path / "d" / "val.bin")) == 6_000


def test_openwebtext_worker_processes_give_the_same_bins(tmp_path):
    _tiny_corpus(tmp_path)
    inputs = [str(tmp_path / "txt"), str(tmp_path / "rest.jsonl")]
    openwebtext.build(inputs, tmp_path / "one", encoding="bytes", val_fraction=0.2)
    openwebtext.build(inputs, tmp_path / "two", encoding="bytes", val_fraction=0.2, num_proc=2)
    for f in ("train.bin", "val.bin"):
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes()


def test_openwebtext_bad_jsonl_line_names_file_and_offset(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(ValueError, match=r"a.jsonl @ byte 17: expected a JSON object with 'text'"):
        openwebtext.build(
            [tmp_path / "a.jsonl"], tmp_path / "o", encoding="bytes", val_fraction=0.5
        )
    assert not list((tmp_path / "o").glob(".*tmp*"))  # no temp file left behind
