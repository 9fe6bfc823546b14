"""Converters (parity.trm_params.from_torch / to_torch), variable kinds and parameter counts."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.trm import TRM, LatentInit, PuzzleTable, TRMConfig
from parity.compare import EXACT, assert_all_close
from parity.files import COMPILE_PREFIX, UnsafeCheckpointError, load_file
from parity.state_dict import StateDictError
from parity.trm_params import from_torch, to_torch

torch = pytest.importorskip("torch")

from parity.trm_fixtures import make_pair, tiny_config  # noqa: E402
from parity.trm_torch import ACTLossHead, build_model  # noqa: E402


def _sd(cfg, seed=0):
    torch.manual_seed(seed)
    head = ACTLossHead(build_model(cfg))
    with torch.no_grad():
        head.model.inner.puzzle_emb.weights.normal_()
    return head.state_dict()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("compiled", [False, True])
def test_round_trip_exact(dtype, compiled):
    cfg = tiny_config("att", dtype)
    sd = _sd(cfg)
    assert sd["model.inner.H_init"].dtype == getattr(torch, dtype)  # bf16 buffers in bf16 runs
    src = {COMPILE_PREFIX + k: v for k, v in sd.items()} if compiled else sd
    model = from_torch(src, cfg)
    assert model.inner.H_init[...].dtype == jnp.dtype(dtype)
    back = to_torch(model, compiled=compiled)
    assert set(back) == set(src)
    assert all(back[k].dtype == src[k].dtype for k in src)
    assert_all_close([(k, back[k], src[k]) for k in src], EXACT)


def test_puzzle_table_of_another_size_becomes_row_mean():
    cfg = tiny_config("att", "float32")  # 5 puzzle ids
    sd = _sd(cfg)
    table = torch.randn(9, cfg.puzzle_emb_ndim)
    sd["model.inner.puzzle_emb.weights"] = table
    model = from_torch(sd, cfg)
    expected = np.broadcast_to(table.mean(0, keepdim=True).numpy(), (5, cfg.puzzle_emb_ndim))
    assert_all_close([("puzzle table", model.inner.puzzle_emb.weights[...], expected)], EXACT)


def test_state_dict_errors_list_every_key():
    cfg = tiny_config("att", "float32")
    sd = _sd(cfg)
    del sd["model.inner.lm_head.weight"]
    sd["model.inner.extra.weight"] = torch.zeros(3)
    sd["model.inner.q_head.bias"] = torch.zeros(3)
    with pytest.raises(StateDictError) as e:
        from_torch(sd, cfg)
    msg = str(e.value)
    for part in (
        "missing keys (1): model.inner.lm_head.weight",
        "unexpected keys (1): model.inner.extra.weight",
        "model.inner.q_head.bias: torch (3,), port inner.q_head.bias (2,)",
    ):
        assert part in msg, msg


def test_pt_file_loads_and_pickled_code_is_refused(tmp_path):
    cfg = tiny_config("mlp_t", "float32")
    sd = _sd(cfg)
    good = tmp_path / "step_10"
    torch.save({COMPILE_PREFIX + k: v for k, v in sd.items()}, good.with_suffix(".pt"))
    model = from_torch(load_file(good.with_suffix(".pt")), cfg)
    assert_all_close([("L_init", model.inner.L_init[...], sd["model.inner.L_init"])], EXACT)

    class Payload:  # anything that is not a tensor/container needs unpickling code
        def __reduce__(self):
            return (print, ("pwned",))

    bad = tmp_path / "bad.pt"
    torch.save({"model.inner.H_init": sd["model.inner.H_init"], "x": Payload()}, bad)
    with pytest.raises(UnsafeCheckpointError):
        load_file(bad)


@pytest.mark.parametrize(
    "content", [b"", b"hi\n", bytes(range(256)) * 4], ids=["empty", "text", "binary"]
)
def test_a_file_that_is_not_a_checkpoint_is_one_value_error_naming_it(tmp_path, content):
    """torch.load's own errors on such files say little ("KeyError: 105"): load_file names the
    file and what it is not."""
    path = tmp_path / "weights.pt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"{path} is not a torch checkpoint") as e:
        load_file(path)
    assert "\n" not in str(e.value)


def test_buffers_are_not_params():
    """H_init/L_init and the puzzle table are never seen by AdamATan2 / the EMA."""
    cfg = tiny_config("att", "float32")
    _, model = make_pair(cfg)
    params = nnx.to_flat_state(nnx.state(model, nnx.Param))
    names = {".".join(map(str, p)) for p, _ in params}
    assert not any(n.endswith(("H_init", "L_init", "puzzle_emb.weights")) for n in names), names
    assert isinstance(model.inner.H_init, LatentInit) and not isinstance(
        model.inner.H_init, nnx.Param
    )
    assert isinstance(model.inner.puzzle_emb.weights, PuzzleTable)
    assert not isinstance(model.inner.puzzle_emb.weights, nnx.Param)
    # same trainable tensors as torch's model.parameters()
    head, _ = make_pair(cfg)
    assert names == {k[len("model.") :] for k, _ in head.named_parameters()}


def _count(cfg):
    import jax

    abstract = nnx.eval_shape(lambda: TRM(cfg, rngs=nnx.Rngs(0)))  # shapes only, no allocation
    return sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (dict(mlp_t=True, pos_encodings="none"), 5_028_866),  # README pretrain_mlp_t_sudoku
        (dict(), 6_828_034),  # pretrain_att_sudoku
        (dict(arch="hrm", H_cycles=2, L_cycles=2, H_layers=4, L_layers=4), 27_275_266),
    ],
    ids=["sudoku-mlp_t", "sudoku-att", "sudoku-hrm"],
)
def test_parameter_counts_match_upstream(overrides, expected):
    cfg = TRMConfig(batch_size=768, seq_len=81, puzzle_emb_ndim=512, vocab_size=11, **overrides)
    assert _count(cfg) == expected


def test_eager_init_equals_traced():
    """Eager construction draws its truncated normals from power-of-two buckets (one compile per
    bucket instead of per shape, models/trm/layers.py::trunc_normal); the values are EXACTLY those
    of the traced draw the trainer makes under jit, for every weight, buffer and RNG state."""
    import jax

    from models.trm.layers import trunc_normal

    cfg = tiny_config(
        "att", "bfloat16", batch_size=2, seq_len=9, num_puzzle_identifiers=3, hidden_size=32,
        num_heads=2, puzzle_emb_ndim=32, puzzle_emb_len=1, halt_max_steps=3,
    )  # fmt: skip
    eager = TRM(cfg, rngs=nnx.Rngs(params=1, exploration=2))
    traced = nnx.jit(lambda: TRM(cfg, rngs=nnx.Rngs(params=1, exploration=2)))()

    def leaves(model):
        out = {}
        for path, v in nnx.to_flat_state(nnx.state(model)):
            a = v.get_value()
            if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
                a = jax.random.key_data(a)
            out["/".join(map(str, path))] = a
        return out

    e, t = leaves(eager), leaves(traced)
    assert e.keys() == t.keys()
    assert all(e[k].dtype == t[k].dtype for k in e)
    assert_all_close([(k, e[k], t[k]) for k in e], EXACT)
    # a shape past the smallest bucket (300 x 300 > 2**16: drawn from 2**17)
    key = jax.random.key(7)
    big = trunc_normal(key, (300, 300), 0.05)
    assert_all_close(
        [("300x300", big, jax.jit(lambda k: trunc_normal(k, (300, 300), 0.05))(key))], EXACT
    )


def test_init_follows_upstream():
    """trunc-normal std 1/sqrt(fan_in) cut at 2 std' (std exact after the rescale), q_head weight 0
    and bias -5, puzzle table zeros, H_init/L_init trunc-normal std 1 in the forward dtype."""
    import jax

    from models.trm.layers import _TRUNC_STD, trunc_normal

    w = np.asarray(trunc_normal(jax.random.key(0), (300, 300), 0.05))
    assert abs(w.std() / 0.05 - 1) < 0.02  # 90,000 draws: sampling error ~0.3%
    assert np.abs(w).max() <= 2 * 0.05 / _TRUNC_STD
    cfg = TRMConfig(
        batch_size=2, seq_len=9, vocab_size=11, num_puzzle_identifiers=3, hidden_size=64,
        num_heads=2, puzzle_emb_ndim=64, puzzle_emb_len=1, forward_dtype="bfloat16",
    )  # fmt: skip
    m = TRM(cfg, rngs=nnx.Rngs(0))
    inner = m.inner
    assert float(np.abs(np.asarray(inner.q_head.weight[...])).max()) == 0.0
    assert np.all(np.asarray(inner.q_head.bias[...]) == -5.0)
    assert float(np.abs(np.asarray(inner.puzzle_emb.weights[...])).max()) == 0.0
    assert inner.H_init[...].dtype == inner.L_init[...].dtype == jnp.bfloat16
    lm = np.asarray(inner.lm_head.weight[...])  # (vocab, hidden): fan_in = hidden
    assert np.abs(lm).max() <= 2 / np.sqrt(64) / _TRUNC_STD
