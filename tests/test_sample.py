"""`python -m train.sample`: fixed-seed text, greedy decoding against torch, the SOURCE kinds, the
char and BPE encodings, FILE: prompts, and the one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the checkpoints are written by our torch nanoGPT

from data import openwebtext  # noqa: E402
from data.shakespeare_char import build as build_char  # noqa: E402
from parity import gpt_torch  # noqa: E402
from parity.compare import EXACT, assert_close  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from train import sample as sample_cmd  # noqa: E402
from train.families.gpt import sample as sample_cli  # noqa: E402

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
ARCH = dict(block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)


def _torch_gpt(vocab_size: int, **extra):
    """A seeded torch nanoGPT with its matrices scaled x15, so that the untrained model's choices
    are sharp and change from token to token (at the 0.02 init every logit is close to 0)."""
    torch.manual_seed(1)  # seed 0 gives this vocabulary one repeated character when greedy
    model = gpt_torch.GPT(gpt_torch.GPTConfig(**ARCH, vocab_size=vocab_size, **extra)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(15.0)
    return model


@pytest.fixture(scope="module")
def char_ckpt(tmp_path_factory):
    """<dir>/ckpt.pt as nanoGPT's train.py saves it (torch.compile's `_orig_mod.` keys, model_args,
    config['dataset']) beside the meta.json / meta.pkl of data.shakespeare_char built from TEXT."""
    d = tmp_path_factory.mktemp("char")
    (d / "input.txt").write_text(TEXT, encoding="utf-8")
    vocab = build_char(d, input_path=d / "input.txt")["vocab_size"]
    model = _torch_gpt(vocab)
    sd = {"_orig_mod." + k: v for k, v in model.state_dict().items()}
    args = dict(ARCH, vocab_size=vocab)
    torch.save({"model": sd, "model_args": args, "config": {"dataset": "x"}}, d / "ckpt.pt")
    return d / "ckpt.pt", model


def _cli(argv):
    """main() as the command runs it; -> (texts, SystemExit message or None)."""
    try:
        return sample_cmd.main([str(a) for a in argv]), None
    except SystemExit as e:
        return None, str(e.code)


# Generated once by this code (CPU, float32) and written here: if this changes, a change in
# loading, encoding, the seed rule or generate changed what users get for the same command.
EXPECTED = [
    "All:\nSpeak\n\nhcfBfrkfhSd.cAAmSy nSf",
    "All:\nSpeakkF.cdrrrrSSSorSr Afh rSr",
]


def test_fixed_seed_continuation_is_reproduced(char_ckpt, capsys):
    path, _ = char_ckpt
    argv = [path, "--start", "All:\nSpeak", "--num-samples", "2", "--max-new-tokens", "24"]
    texts, err = _cli([*argv, "--seed", "7"])
    assert err is None, err
    assert texts == EXPECTED
    printed = capsys.readouterr().out
    assert printed == "".join(t + "\n" + sample_cmd.SEPARATOR + "\n" for t in EXPECTED)


def test_same_seed_same_text_other_seed_other_text(char_ckpt):
    path, _ = char_ckpt
    model, codec = sample_cli.load_source(str(path))
    kw = dict(max_new_tokens=24)  # the shapes of the test above: its compiled loop is reused
    start = "Speak, all"
    a = sample_cli.sample(model, codec, start, num_samples=3, seed=0, **kw)
    assert a == sample_cli.sample(model, codec, start, num_samples=3, seed=0, **kw)
    assert sample_cli.sample(model, codec, start, num_samples=3, seed=1, **kw) != a
    assert len(set(a)) == 3  # each sample has its own key
    # sample i depends on (seed, i) only, not on how many samples are drawn
    assert sample_cli.sample(model, codec, start, num_samples=1, seed=0, **kw) == a[:1]


def test_greedy_equals_torch_greedy_decoding(char_ckpt, x64):
    """--temperature 0 is greedy decoding, token for token the torch reference's generate with
    top_k=1 on the same ckpt.pt, in float64. 6 + 30 tokens > block_size 16: the context is cropped
    for the last 20 steps, as nanoGPT crops it."""
    path, tmodel = char_ckpt
    model, codec = sample_cli.load_source(str(path), dtype="float64")
    prompt = "Speak, "
    ours = sample_cli.sample(model, codec, prompt, num_samples=2, max_new_tokens=30, temperature=0)
    with torch.no_grad():
        idx = torch.tensor([codec.encode(prompt)])
        ref = tmodel.double().generate(idx, 30, temperature=1.0, top_k=1)[0].tolist()
    ours_ids = [codec.encode(t) for t in ours]
    assert_close("greedy tokens", np.array(ours_ids[0]), np.array(ref), EXACT)
    assert ours[0] == ours[1]  # greedy ignores the seed
    assert len(set(ref[len(prompt) :])) > 3  # a real sequence, not one repeated character


def test_file_prompt_is_the_file_contents(char_ckpt, tmp_path):
    path, _ = char_ckpt
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("All:\nSpeak", encoding="utf-8")
    argv = [path, "--num-samples", "2", "--max-new-tokens", "24", "--seed", "7"]
    texts, err = _cli([*argv, "--start", f"FILE:{prompt}"])
    assert err is None, err
    assert texts == EXPECTED


def test_char_and_bpe_encodings(char_ckpt, tmp_path, x64):
    """Char: the meta beside ckpt.pt (meta.json preferred, the data-only meta.pkl alike). BPE: a
    tiktoken encoding named by a data.openwebtext meta (the offline byte-level one), here for an HF
    GPT-2 .safetensors file, whose architecture comes from the config.json beside it; its greedy
    text is torch's (float64, tanh GELU)."""
    from safetensors.torch import save_file

    path, _ = char_ckpt
    _, codec = sample_cli.load_source(str(path))
    assert isinstance(codec, sample_cli.CharCodec) and codec.where.endswith("meta.json")
    assert codec.decode(codec.encode(TEXT)) == TEXT
    pkl = sample_cli.resolve_codec(str(path.parent / "meta.pkl"))
    assert pkl.stoi == codec.stoi and pkl.itos == codec.itos

    for i in range(2):
        (tmp_path / f"doc{i}.txt").write_text(f"byte-level document {i}\n", encoding="utf-8")
    docs = [tmp_path / "doc0.txt", tmp_path / "doc1.txt"]
    openwebtext.build(docs, tmp_path / "owt", encoding="bytes", val_fraction=0.5)
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    tmodel = _torch_gpt(257, gelu_approximate=True)
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    hf = {
        k[len("transformer.") :]: (v.t() if k.endswith(conv1d) else v).contiguous().clone()
        for k, v in tmodel.state_dict().items()
        if k.startswith("transformer.")  # GPT2Model keys; lm_head is tied and not stored
    }
    save_file(hf, str(hf_dir / "model.safetensors"))
    (hf_dir / "config.json").write_text(json.dumps({"n_head": ARCH["n_head"]}))
    model, bpe = sample_cli.load_source(
        str(hf_dir / "model.safetensors"), meta=str(tmp_path / "owt"), dtype="float64"
    )
    assert isinstance(bpe, sample_cli.BPECodec)
    assert model.config.gelu_approximate and model.config.vocab_size == 257
    prompt = "héllo"  # non-ASCII: two byte tokens for é
    assert bpe.encode(prompt) == list(prompt.encode("utf-8"))
    (text,) = sample_cli.sample(model, bpe, prompt, num_samples=1, max_new_tokens=8, temperature=0)
    with torch.no_grad():
        ref = tmodel.double().generate(torch.tensor([bpe.encode(prompt)]), 8, top_k=1)[0].tolist()
    assert text == bpe.decode(ref)


def _one_line_error(argv, *expected):
    texts, err = _cli(argv)
    assert texts is None and err is not None
    assert err.startswith("error: ") and "\n" not in err, err
    for part in expected:
        assert part in err, err


def test_bad_input_is_one_clear_line(char_ckpt, tmp_path):
    path, _ = char_ckpt
    _one_line_error([tmp_path / "missing.pt"], "missing.pt", "no such file")
    other = tmp_path / "weights.npz"
    other.write_bytes(b"")
    _one_line_error([other], "weights.npz", "unknown kind")
    _one_line_error([tmp_path], "without config.yaml")
    _one_line_error([path, "--start", "Speak ~"], "'~'", "position 6", "meta.json")
    _one_line_error([path, "--start", ""], "no token")
    _one_line_error([path, "--start", f"FILE:{tmp_path / 'nope.txt'}"], "nope.txt")
    (tmp_path / "prompt.bin").write_bytes(bytes(range(128, 256)))
    _one_line_error([path, "--start", f"FILE:{tmp_path / 'prompt.bin'}"], "prompt.bin: not UTF-8")
    _one_line_error([path, "--temperature", "-1"], "--temperature")
    _one_line_error([path, "--meta", tmp_path / "none.json"], "none.json")
    # a checkpoint that does not fit its model_args: StateDictError's key list, on one line
    bad = torch.load(path, weights_only=True)
    bad["model_args"] = dict(bad["model_args"], n_embd=48)
    torch.save(bad, tmp_path / "bad.pt")
    _one_line_error([tmp_path / "bad.pt"], "does not match the model", "wrong shapes")


@pytest.mark.slow  # ~20 s on 2 cores (a trainer run, an export, two restores)
def test_run_directory_samples_as_its_exported_ckpt(tmp_path):
    """A run directory of the trainer (3 steps of a tiny char GPT) samples the same text as the
    nanoGPT ckpt.pt that train.export writes from it: the run's checkpoint, vocabulary (from the
    run's data.path meta) and architecture are read back, and the export's config names the data
    directory whose meta gives the same characters. A meta of another vocabulary is one line."""
    import jax

    from tests.helpers import build_tiny_text, tiny_gpt_overrides
    from train.compose import load_config
    from train.export import export
    from train.mesh import make_mesh
    from train.trainer import train

    data = build_tiny_text(str(tmp_path / "text"))
    cfg = load_config(tiny_gpt_overrides(data, str(tmp_path), "run", steps=3))
    train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    run_dir = str(tmp_path / "run")
    ckpt = export(run_dir, str(tmp_path / "out" / "ckpt.pt"))
    argv = ["--start", "ALDA:\n", "--num-samples", "2", "--max-new-tokens", "20", "--seed", "3"]
    from_run, err = _cli([run_dir, *argv])
    assert err is None, err
    from_ckpt, err = _cli([ckpt, *argv])
    assert err is None, err
    assert from_run == from_ckpt and all(t.startswith("ALDA:\n") for t in from_run)
    assert len(from_run[0]) == len("ALDA:\n") + 20  # one character per token: the char vocabulary
    # the trainer took vocab_size from the data set's meta: another meta does not fit the run
    other = tmp_path / "other"
    other.mkdir()
    (other / "input.txt").write_text(TEXT, encoding="utf-8")
    build_char(other, input_path=other / "input.txt")
    _one_line_error([run_dir, "--meta", other], "vocab_size=30", "vocab_size=47", "--meta")
    _one_line_error([run_dir, "--step", "99"], "--step 99", "not saved; checkpoints: [")


@pytest.mark.slow  # the default tier checks it on train.main (test_train_inputs)
def test_command_line_prints_no_tpu_probe_lines(char_ckpt):
    """The command as a user runs it, JAX_PLATFORMS unset, libtpu installed (make test installs
    it) and no TPU: the samples and nothing of libtpu's probe (train.runtime.quiet_tpu_probe,
    which every entry point calls; docs/training.md, "Setting JAX_PLATFORMS in os.environ after import jax does nothing")."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    cmd = [sys.executable, "-m", "train.sample", str(char_ckpt[0]), "--start", "All:"]
    cmd += ["--num-samples", "1", "--max-new-tokens", "4"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("All:"), done.stderr[-3000:]
    noise = ("libtpu", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "InitGoogle", "E0000")
    assert not any(n in done.stderr for n in noise), done.stderr[-3000:]
