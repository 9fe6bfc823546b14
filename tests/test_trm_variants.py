"""A TRM variant without an upstream twin (docs/architecture.md, "Changing the model where upstream
has no counterpart"): TRMConfig's fields are listed as upstream's or as ways of computing the same
function, and any other field set away from its default is a variant; the PyTorch reference
refuses it in one line, train.export refuses to write keys upstream's model lacks unless
--allow-extra-keys, and such a file loads labelled as what it is. The variant is made here, in
the test: a TRMConfig subclass with one more field, and upstream's key set short of one real key
(the port then holds a parameter upstream lacks, as a variant's gate would be)."""

from __future__ import annotations

import dataclasses
import logging
import os

import pytest

from models.trm import TRMConfig
from models.trm.config import SAME_FUNCTION_FIELDS, UPSTREAM_FIELDS, upstream_config, variant_fields
from parity.trm_fixtures import tiny_config
from tests.helpers import build_tiny_sudoku, tiny_trm_overrides

torch = pytest.importorskip("torch")

REFUSAL = (
    "model.gated_latent=True: the PyTorch reference implements upstream's TRM only; it has no "
    "gated_latent (a variant without an upstream twin: docs/architecture.md, 'Changing the model "
    "where upstream has no counterpart')"
)
# A real key of the tiny run's state_dict, taken out of upstream's key set below
LACKED = "model.inner.q_head.bias"


# A fork's TRMConfig: one more field, off by default
ForkTRMConfig = dataclasses.make_dataclass(
    "ForkTRMConfig", [("gated_latent", bool, False)], bases=(TRMConfig,), frozen=True
)


def _gated(config: TRMConfig, **values):
    """`config` as a ForkTRMConfig (`values`: its gated_latent)."""
    return ForkTRMConfig(**dataclasses.asdict(config), **values)


def test_every_field_is_upstreams_or_computes_the_same_function():
    """The two lists hold every TRMConfig field once: a field added to TRMConfig is in neither,
    so it is a variant until someone lists it."""
    names = [f.name for f in dataclasses.fields(TRMConfig)]
    assert sorted(UPSTREAM_FIELDS + SAME_FUNCTION_FIELDS) == sorted(names)
    assert not set(UPSTREAM_FIELDS) & set(SAME_FUNCTION_FIELDS)
    assert variant_fields(TRMConfig(remat=True, scan=True, attention_impl="xla")) == {}


def test_the_reference_refuses_a_field_it_does_not_implement():
    """A field outside both lists: at its default the reference builds upstream's model (the same
    state_dict keys as the plain config's); set, one line naming it and its value."""
    from parity.trm_torch import ACTLossHead, build_model
    from parity.trm_torch.modeling import NoUpstreamTwin

    cfg = tiny_config("mlp_t", "float32")
    plain = ACTLossHead(build_model(cfg)).state_dict().keys()
    assert ACTLossHead(build_model(_gated(cfg))).state_dict().keys() == plain
    with pytest.raises(NoUpstreamTwin) as e:
        build_model(_gated(cfg, gated_latent=True))
    assert str(e.value) == REFUSAL
    assert variant_fields(_gated(cfg, gated_latent=True)) == {"gated_latent": True}
    assert upstream_config(_gated(cfg, gated_latent=True)) == _gated(cfg)


def test_upstream_keys_are_the_references_and_the_ports(monkeypatch):
    """parity.trm_params.upstream_keys: the reference's keys, which are the port's (to_torch), for
    every arch, with torch and without it (the port's then); a variant's are its upstream
    model's."""
    import sys

    from flax import nnx

    from models.trm import TRM
    from parity.trm_params import to_torch, upstream_keys

    archs = ("mlp_t", "att", "hrm", "singlez", "hier6", "baseline")
    ref = {}
    for variant in archs:
        cfg = tiny_config(variant, "float32")
        ref[variant] = upstream_keys(cfg)
        assert ref[variant] == set(to_torch(TRM(cfg, rngs=nnx.Rngs(0)))), variant
        assert upstream_keys(_gated(cfg, gated_latent=True)) == ref[variant], variant
    monkeypatch.setitem(sys.modules, "torch", None)  # an import of torch raises
    for variant in archs:
        assert upstream_keys(_gated(tiny_config(variant, "float32"))) == ref[variant], variant


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(data dir, overrides, Source): trm_sudoku_tiny shrunk, its task's fresh state as the
    source train.export reads (no training: the export's checks see the same state_dict)."""
    from train.compose import load_config
    from train.families import make_task
    from train.mesh import make_mesh
    from train.source import Source

    root = tmp_path_factory.mktemp("variants")
    data = build_tiny_sudoku(str(root / "sudoku"))
    # the model and data settings an upstream file is opened with; float32 loss: no
    # process-wide x64 switch in this worker
    overrides = [
        o
        for o in tiny_trm_overrides(data, str(root / "runs"), "tiny")
        if not o.startswith(("run.", "logging.", "trainer.log"))
    ] + ["model.loss_dtype=float32"]
    cfg = load_config(overrides)
    task = make_task(cfg, make_mesh(cfg.mesh))
    return data, overrides, Source("run", "runs/tiny", cfg, task, task.create_state(), 0, {})


@pytest.fixture
def run(made, monkeypatch):
    """The run directory train.export is given ("runs/tiny": `made`'s Source), data, overrides."""
    import train.export

    data, overrides, src = made
    monkeypatch.setattr(train.export, "open_source", lambda source, step=None: src)
    return src.path, data, overrides


@pytest.fixture
def upstream_lacks_a_key(monkeypatch):
    """Upstream's key set without LACKED: the run's model holds a parameter upstream lacks."""
    import train.families.trm.task as trm_task

    real = trm_task.upstream_keys
    monkeypatch.setattr(trm_task, "upstream_keys", lambda cfg: real(cfg) - {LACKED})


def test_export_refuses_keys_upstream_lacks_unless_allowed(run, upstream_lacks_a_key, tmp_path,
                                                           capsys, caplog):  # fmt: skip
    """Without the flag: one line naming the key and the flag, and no file. With it: the file,
    a line on stderr naming the key, the path on stdout; opened again (train.evaluate's way in,
    trainer.init_from's import) it is labelled by what it is, not as upstream's checkpoint."""
    from train.export import main
    from train.source import open_source

    run_dir, data, overrides = run
    out = str(tmp_path / "step_1")
    with pytest.raises(SystemExit) as e:
        main([run_dir, "--out", out])
    assert e.value.code == (
        f"error: {run_dir}: its state_dict holds keys upstream's model lacks ({LACKED}), a "
        "variant without an upstream twin; --allow-extra-keys writes them anyway"
    )
    assert not os.path.exists(out)

    capsys.readouterr()
    main([run_dir, "--out", out, "--allow-extra-keys"])
    printed = capsys.readouterr()
    assert printed.out == f"{out}\n"
    assert printed.err.splitlines()[-1] == (
        f"{out}: written with keys upstream's model lacks: {LACKED}"
    )
    assert LACKED in torch.load(out, weights_only=True)

    with caplog.at_level(logging.INFO, logger="train.families.trm.task"):
        src = open_source(out, data=data, overrides=overrides)
    assert src.kind == f"upstream_trm with keys upstream lacks: {LACKED}"
    assert [r.getMessage() for r in caplog.records if r.name == "train.families.trm.task"] == [
        f"{out}: upstream_trm with keys upstream lacks: {LACKED}"
    ]


def test_export_of_upstreams_model_is_unchanged(run, tmp_path, capsys):
    """Upstream's model: no extra key, nothing but the path printed, and the file opens as
    upstream's checkpoint (kind upstream_trm)."""
    from train.export import main
    from train.source import open_source

    run_dir, data, overrides = run
    out = str(tmp_path / "step_1")
    main([run_dir, "--out", out])
    assert capsys.readouterr() == (f"{out}\n", "")
    assert open_source(out, data=data, overrides=overrides).kind == "upstream_trm"
