"""Weight conversion: nanoGPT / HF GPT-2 state_dicts <-> the NNX port, and the refusals."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference side: torch-free installs skip this module

from models.gpt import GPTConfig  # noqa: E402
from parity import gpt_torch  # noqa: E402
from parity.compare import EXACT, FLOAT32, FLOAT64, assert_all_close, assert_close, compare  # noqa: E402
from parity.files import COMPILE_PREFIX, UnsafeCheckpointError  # noqa: E402
from parity.gpt_params import from_torch, from_torch_file, to_torch  # noqa: E402
from parity.state_dict import StateDictError  # noqa: E402

TINY = dict(block_size=16, vocab_size=65, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _torch_model(**over):
    torch.manual_seed(0)
    return gpt_torch.GPT(gpt_torch.GPTConfig(**{**TINY, **over})).eval()


def _hf_layout(sd, *, prefix=True, lm_head=True):
    """What GPT2LMHeadModel.state_dict() looks like: Conv1D (in, out) and two buffers per layer."""
    out = {}
    for k, v in sd.items():
        if k == "lm_head.weight" and not lm_head:
            continue
        v = v.t().contiguous() if k.endswith(CONV1D) else v
        out[k if prefix else k.removeprefix("transformer.")] = v
    T = TINY["block_size"]
    for i in range(TINY["n_layer"]):
        p = "transformer." if prefix else ""
        out[f"{p}h.{i}.attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        out[f"{p}h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return out


def _logits(model, idx):
    return model(jnp.asarray(idx), jnp.asarray(idx))[0]


@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "_orig_mod"])
@pytest.mark.parametrize("bias", [True, False])
def test_round_trip_torch_jax_torch_is_exact(compiled, bias):
    tmodel = _torch_model(bias=bias)
    sd = tmodel.state_dict()
    src = {COMPILE_PREFIX + k: v for k, v in sd.items()} if compiled else sd
    jmodel = from_torch(src, GPTConfig(**{**TINY, "bias": bias}))
    back = to_torch(jmodel)
    assert list(back) == list(sd), "keys (and their order) must be nanoGPT's"
    assert_all_close([(k, back[k], sd[k]) for k in sd], EXACT)
    fresh = gpt_torch.GPT(gpt_torch.GPTConfig(**{**TINY, "bias": bias}))
    fresh.load_state_dict(back, strict=True)  # loads into nanoGPT unchanged
    assert back["lm_head.weight"] is back["transformer.wte.weight"]  # tied


def test_ckpt_pt_file_with_model_args(tmp_path):
    tmodel = _torch_model(bias=False)
    ckpt = {
        "model": {COMPILE_PREFIX + k: v for k, v in tmodel.state_dict().items()},
        "model_args": {**TINY, "bias": False},
        "iter_num": 10,
        "best_val_loss": torch.tensor(1.5),
        "config": {"dataset": "shakespeare_char", "compile": True},
    }
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    jmodel = from_torch_file(path)  # config from model_args
    assert jmodel.config.bias is False and jmodel.config.n_embd == TINY["n_embd"]
    back = to_torch(jmodel)
    assert_all_close([(k, back[k], v) for k, v in tmodel.state_dict().items()], EXACT)


@pytest.mark.parametrize(
    "prefix,lm_head", [(True, True), (False, False)], ids=["GPT2LMHeadModel", "GPT2Model"]
)
def test_hf_conv1d_layout_gives_the_same_logits(prefix, lm_head):
    tmodel = _torch_model()
    cfg = GPTConfig(**TINY)
    hf = _hf_layout(tmodel.state_dict(), prefix=prefix, lm_head=lm_head)
    assert hf["transformer.h.0.mlp.c_fc.weight" if prefix else "h.0.mlp.c_fc.weight"].shape == (
        32,
        128,
    )
    idx = np.arange(2 * 16).reshape(2, 16) % TINY["vocab_size"]
    j_hf = from_torch(hf, cfg)
    j_nano = from_torch(tmodel.state_dict(), cfg)
    assert_close(
        "logits HF layout vs nanoGPT layout", _logits(j_hf, idx), _logits(j_nano, idx), EXACT
    )
    with torch.no_grad():
        t_logits = tmodel(torch.as_tensor(idx), torch.as_tensor(idx))[0]
    assert_close("logits HF layout vs torch", _logits(j_hf, idx), t_logits, FLOAT32)


def test_safetensors_gpt2_file_loads_with_tanh_gelu(tmp_path, x64):
    """A real .safetensors file in the layout of the HF GPT-2 hub file (GPT2Model keys: no
    `transformer.` prefix, no lm_head since it is tied, Conv1D (in, out) weights, float32,
    attn.bias / attn.masked_bias buffers), written with the safetensors package and loaded by
    `from_torch_file`. HF GPT-2 computes the tanh GELU ("gelu_new"), so the file's logits are
    reproduced with GPTConfig(gelu_approximate=True), compared with our torch reference reading
    the same file. The exact (erf) GELU, nanoGPT's, misses both FLOAT64 and FLOAT32: the
    difference is real, not a rounding. c_fc is scaled x10 so GELU sees inputs of order 1 as in a
    trained GPT-2 (at the 0.02 init they are ~0.1 and the two forms differ by only 5e-6 of the
    logits' scale, which FLOAT32 would not see)."""
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    tmodel = gpt_torch.GPT(gpt_torch.GPTConfig(**TINY, gelu_approximate=True)).eval()
    with torch.no_grad():
        for name, p in tmodel.named_parameters():
            if name.endswith("mlp.c_fc.weight"):
                p.mul_(10.0)
    hf = _hf_layout(tmodel.state_dict(), prefix=False, lm_head=False)
    assert "wte.weight" in hf and "h.0.attn.masked_bias" in hf and "lm_head.weight" not in hf
    assert hf["h.0.attn.c_attn.weight"].shape == (32, 96)  # Conv1D: (in, out)
    path = tmp_path / "model.safetensors"
    save_file({k: v.detach().float().contiguous().clone() for k, v in hf.items()}, str(path))
    # the torch reference reads the same file (HF -> nanoGPT keys written out here, independently
    # of parity/gpt_params.py): Conv1D transposed back, buffers dropped, lm_head tied to wte
    ref = gpt_torch.GPT(gpt_torch.GPTConfig(**TINY, gelu_approximate=True)).eval()
    nano = {
        "transformer." + k: (v.t() if k.endswith(CONV1D) else v)
        for k, v in load_file(str(path)).items()
        if not k.endswith((".attn.bias", ".attn.masked_bias"))
    }
    ref.load_state_dict({**nano, "lm_head.weight": nano["transformer.wte.weight"]}, strict=True)
    ref = ref.double()  # float32 values, exact in float64
    idx = np.arange(2 * 16).reshape(2, 16) % TINY["vocab_size"]
    with torch.no_grad():
        expected = ref(torch.as_tensor(idx), torch.as_tensor(idx))[0]
    tanh = from_torch_file(path, GPTConfig(**TINY, dtype="float64", gelu_approximate=True))
    assert_close("logits, HF file, tanh GELU", _logits(tanh, idx), expected, FLOAT64)
    erf = from_torch_file(path, GPTConfig(**TINY, dtype="float64", gelu_approximate=False))
    for tol in (FLOAT64, FLOAT32):
        wrong = compare("logits, HF file, erf GELU", _logits(erf, idx), expected, tol)
        assert not wrong.passed, f"the erf GELU should miss {tol.name}: {wrong.message()}"


def test_bad_keys_and_shapes_are_named():
    sd = dict(_torch_model().state_dict())
    del sd["transformer.h.1.mlp.c_fc.bias"]
    sd["transformer.h.0.attn.extra.weight"] = torch.zeros(3)
    sd["transformer.wpe.weight"] = torch.zeros(8, 32)
    with pytest.raises(StateDictError) as e:
        from_torch(sd, GPTConfig(**TINY))
    msg = str(e.value)
    assert "missing keys (1): transformer.h.1.mlp.c_fc.bias" in msg
    assert "unexpected keys (1): transformer.h.0.attn.extra.weight" in msg
    assert "transformer.wpe.weight: got (8, 32), expected (16, 32)" in msg


def test_wrong_config_is_refused():
    sd = _torch_model().state_dict()
    with pytest.raises(StateDictError, match="unexpected keys .*h.1"):
        from_torch(sd, GPTConfig(**{**TINY, "n_layer": 1}))


def test_untied_lm_head_is_refused():
    sd = dict(_torch_model().state_dict())
    sd["lm_head.weight"] = sd["lm_head.weight"].clone() + 1.0
    with pytest.raises(StateDictError, match="lm_head.weight .* is not tied"):
        from_torch(sd, GPTConfig(**TINY))


class _Payload:
    """Stands for any pickled object beyond tensors: loading it would run code."""

    def __reduce__(self):
        return (print, ("this ran during unpickling",))


def test_pickled_code_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": _torch_model().state_dict(), "hook": _Payload()}, path)
    with pytest.raises(UnsafeCheckpointError, match="refusing to load .*evil.pt"):
        from_torch_file(path, GPTConfig(**TINY))


def test_plain_state_dict_file_needs_a_config(tmp_path):
    path = tmp_path / "sd.pt"
    torch.save(_torch_model().state_dict(), path)
    with pytest.raises(ValueError, match="no 'model_args'.*pass config="):
        from_torch_file(path)
    jmodel = from_torch_file(path, GPTConfig(**TINY))
    assert jmodel.get_num_params() == _torch_model().get_num_params()


def test_importing_models_gpt_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, models.gpt; assert 'torch' not in sys.modules, 'models.gpt imported torch'"
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        cwd=str(__import__("pathlib").Path(__file__).parents[1]),
    )


def test_conversion_compiles_nothing_for_new_shapes():
    """from_torch builds the module abstractly (nnx.eval_shape) and fills it from the state_dict.
    Building it eagerly drew every initial weight op by op, compiling each op for every new
    parameter shape (15 XLA compilations, ~4 s on 2 CPU cores, for a 1-layer model): a second
    conversion with shapes this process has never seen must compile nothing."""
    import jax

    compiles = []

    def listener(event, secs, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(secs)

    from_torch(_torch_model().state_dict(), GPTConfig(**TINY))  # warm: the dropout-stream forks
    odd = dict(TINY, block_size=20, vocab_size=71, n_layer=1, n_head=5, n_embd=40)  # new shapes
    sd = gpt_torch.GPT(gpt_torch.GPTConfig(**odd)).state_dict()
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        jmodel = from_torch(sd, GPTConfig(**odd))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == [], f"from_torch compiled {len(compiles)} XLA programs"
    back = to_torch(jmodel)
    assert_all_close([(k, back[k], v) for k, v in sd.items()], EXACT)  # every value from torch


def test_rngs_seeds_the_dropout_streams():
    """The dropout streams are forks of `rngs` (no weight is random): the same rngs draw the same
    masks at every site, another seed other masks."""
    from flax import nnx

    sd = _torch_model(dropout=0.2).state_dict()
    cfg = GPTConfig(**{**TINY, "dropout": 0.2})
    masks = []
    for seed in (1, 1, 2):
        jmodel = from_torch(sd, cfg, rngs=nnx.Rngs(dropout=seed))
        sites = [jmodel.drop] + [b.mlp.dropout for b in jmodel.h]
        masks.append(np.stack([s(jnp.ones(256), deterministic=False) == 0 for s in sites]))
    assert masks[0].any(axis=1).all() and not masks[0].all(axis=1).any()  # real masks
    assert (masks[0] == masks[1]).all() and (masks[0] != masks[2]).any()
    assert (masks[0][0] != masks[0][1]).any()  # each site its own stream


def test_conversions_with_one_config_share_no_variable():
    """The abstract module is cached per config; each conversion merges fresh Variables from it
    (nnx.merge(copy=True): without the copy both models would hold one set of Variables, and the
    second conversion would overwrite the first model's weights)."""
    sd_a = _torch_model().state_dict()
    sd_b = {k: v + 1.0 for k, v in sd_a.items()}
    cfg = GPTConfig(**TINY)
    a = from_torch(sd_a, cfg)
    b = from_torch(sd_b, cfg)
    assert a.wte.embedding is not b.wte.embedding
    back_a, back_b = to_torch(a), to_torch(b)
    assert_all_close([(k, back_a[k], v) for k, v in sd_a.items()], EXACT)
    assert_all_close([(k, back_b[k], v) for k, v in sd_b.items()], EXACT)


@pytest.mark.parametrize("bias", [True, False])
def test_the_key_map_describes_nanogpt_as_its_module_does(bias):
    """parity.gpt_params builds its key map from nanoGPT's state_dict described from the config
    alone (no torch needed to load a .safetensors file): that description IS keymap.describe_torch
    of the reference module, key for key (module classes, shapes, enclosing modules, the tie)."""
    from parity.gpt_params import describe_nanogpt, keymap
    from parity.keymap import describe_torch

    cfg = dict(TINY, bias=bias)
    assert describe_nanogpt(GPTConfig(**cfg)) == describe_torch(_torch_model(bias=bias))
    km = keymap(GPTConfig(**cfg))  # by the toolkit's rules: every key maps, lm_head tied
    assert km.complete and km.tied == {"lm_head.weight": "transformer.wte.weight"}
