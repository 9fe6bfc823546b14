"""Config errors are caught before any compute, with messages that name the key; every shipped
experiment composes, validates and builds its abstract train state."""

from __future__ import annotations

import glob
import math
import os
import pathlib

import jax
import pytest

from train.compose import CONFIG_DIR, compose, load_config
from train.errors import ConfigError
from train.mesh import make_mesh, mesh_shape

EXPERIMENTS = sorted(
    os.path.splitext(os.path.basename(p))[0]
    for p in glob.glob(os.path.join(CONFIG_DIR, "experiment", "*.yaml"))
)


def test_required_experiments_exist():
    for name in (
        "trm_sudoku",
        "trm_sudoku_att",
        "trm_maze",
        "trm_arc1",
        "trm_arc2",
        "hrm_sudoku",
        "gpt_shakespeare_char",
        "gpt2_124m",
        "trm_sudoku_tiny",
        "gpt_shakespeare_char_tiny",
    ):
        assert name in EXPERIMENTS
        with open(os.path.join(CONFIG_DIR, "experiment", f"{name}.yaml")) as f:
            head = f.read().splitlines()[:4]
        assert head[0] == "# @package _global_"
        assert head[1].startswith("# Command:") and f"+experiment={name}" in head[1], head


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_validates(name):
    cfg = load_config([f"+experiment={name}"])
    assert cfg.run.name


# Parameter counts of the shipped experiments that upstream / nanoGPT publish (TRM: nnx.Param
# only, the puzzle table is a buffer; GPT: tied wte once, wpe included).
KNOWN_PARAMETER_COUNTS = {
    "trm_sudoku": 5_028_866,  # README pretrain_mlp_t_sudoku
    "trm_sudoku_att": 6_828_034,  # pretrain_att_sudoku
    "hrm_sudoku": 27_275_266,
    "gpt2_124m": 124_373_760,  # train.py's GPT-2 124M: bias False, vocab 50304
    "gpt_shakespeare_char": 10_745_088,
}


def _parameter_count(task) -> int:
    from flax import nnx

    if task.cfg.family == "trm":
        params = task.abstract_state["train"].params
    else:  # the GPT state is nnx.split((model, optimizer)): merge the abstract leaves back
        model, _ = nnx.merge(task.graphdef, task.abstract_state)
        params = nnx.state(model, nnx.Param)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_builds_its_abstract_train_state(name):
    """Every configs/experiment/*.yaml (globbed: a new file is covered without editing this test)
    builds its model config, its model and its whole train state (params, optimizer state, EMA,
    TRM carry) through jax.eval_shape, as the trainer does before allocating anything: shapes
    only, so GPT-2 124M and the ARC puzzle tables cost no memory here. Where the parameter count is
    published it must match, so an experiment that builds the wrong model fails too."""
    from train.families import family

    cfg = load_config([f"+experiment={name}"])
    live = sum(a.nbytes for a in jax.live_arrays())
    cls = family(cfg.family).task  # make_task without its process-wide x64 switch
    with jax.enable_x64(cls.needs_x64(cfg)):  # the trainer enables x64 for the float64 TRM loss
        task = cls(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]), need_data=False)
    grown = sum(a.nbytes for a in jax.live_arrays()) - live
    assert grown < 2**20, f"{name}: building the abstract state allocated {grown} bytes"
    leaves = jax.tree.leaves(task.abstract_state)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert jax.tree.structure(task.state_shardings) == jax.tree.structure(task.abstract_state)
    n = _parameter_count(task)
    assert n > 0
    if name in KNOWN_PARAMETER_COUNTS:
        assert n == KNOWN_PARAMETER_COUNTS[name], (name, n)


@pytest.mark.parametrize(
    "override, needle",
    [
        (["trainer.global_batch_sise=3"], "global_batch_sise"),  # unknown trainer key
        (["+trainer.nope=1"], "nope"),
        (["trainer.global_batch_size=-4"], "trainer.global_batch_size"),
        (["trainer.log_interval=abc"], "log_interval"),  # wrong type
        (["mesh.axis_types=manual"], "mesh.axis_types"),
        (["mesh.fsdp=-1", "mesh.data=-1"], "mesh"),
        (["mesh.platform=v4"], "mesh.platform"),
        (["logging.wandb=sometimes"], "logging.wandb"),
        (["+optim.learning_rat=1"], "learning_rat"),  # unknown optimiser key (GPT)
        (["+model.n_layers=3"], "n_layers"),  # unknown model field
        (["optim.lr_decay_iters=1"], "lr_decay_iters"),
    ],
)
def test_bad_gpt_config_is_rejected_with_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle):
        cfg = load_config(["+experiment=gpt_shakespeare_char_tiny", *override])
        # model fields are checked when the task builds GPTConfig (still before any compute)
        from train.families import make_task

        try:
            make_task(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]), need_data=False)
        except Exception as e:  # noqa: BLE001
            raise ConfigError(str(e)) from e


@pytest.mark.parametrize(
    "override, needle",
    [
        (["+optim.learning_rate=1"], "learning_rate"),  # a nanoGPT key in a TRM run
        (["+optim.global_batch_size=3"], "global_batch_size"),  # trainer-owned
        (["data.epochs=0"], "data.epochs"),
    ],
)
def test_bad_trm_config_is_rejected_with_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(["+experiment=trm_sudoku_tiny", *override])


def test_trm_data_sizes_come_from_the_data_set_or_its_own_config():
    """TRMDataConfig leaves a data set's sizes unknown (None): each data config states its own
    (configs/data/*.yaml), read when the data set is not on disk (AOT compilation), and a section
    that states none is one line naming them before anything is built. `--info` counts the
    schedule's steps from them (upstream's formula) until the data set is built; a data set
    built on first use is counted once built."""
    from models.trm.optim import total_steps
    from train.config import section_defaults
    from train.families import family
    from train.families.trm.data import SIZES, TRMDataConfig

    assert all(section_defaults(TRMDataConfig)[k] is None for k in SIZES)
    cls = family("trm").task
    cfg = load_config(["+experiment=trm_sudoku", "data.path=nowhere"])
    t, d = cfg.trainer, cfg.data
    n = total_steps(d.epochs, d.total_groups, d.mean_puzzle_examples, t.global_batch_size)
    assert cls.planned_steps(cfg).startswith(f"{n} (data.epochs={d.epochs} ")
    tiny = load_config(["+experiment=trm_sudoku_tiny", "data.path=nowhere"])
    assert cls.planned_steps(tiny).endswith(": counted once the data set is built")
    unknown = ["data.total_groups=null", "data.mean_puzzle_examples=null"]
    bad = load_config(["+experiment=trm_sudoku", "data.path=nowhere", *unknown])
    with pytest.raises(ConfigError) as e:
        cls(bad, make_mesh(bad.mesh, devices=jax.devices()[:1]), need_data=False)
    line = str(e.value)
    assert line.startswith("data.total_groups: unknown without the data set (data.path='nowhere'")
    assert "give data.total_groups, data.mean_puzzle_examples" in line and "\n" not in line


def test_the_ema_default_has_one_owner():
    """optim.ema is TRMOptimConfig's default (True, as every run of upstream's README) and no
    shipped config restates or flips it; an upstream all_config.yaml without `ema` is read as
    upstream's own default, False."""
    import yaml

    from models.trm.training import TRMOptimConfig
    from train.families.trm.weights import upstream_overrides

    assert TRMOptimConfig().ema is True
    for path in sorted(pathlib.Path(CONFIG_DIR).rglob("*.yaml")):
        doc = yaml.safe_load(path.read_text()) or {}
        optim = doc if path.parent.name == "optim" else doc.get("optim") or {}
        assert "ema" not in optim, path
    assert "optim.ema=false" in upstream_overrides({})
    assert "optim.ema=true" in upstream_overrides({"ema": True})


def test_the_docs_give_each_sudoku_experiment_the_blanks_its_config_builds():
    """A line of README.md, docs/*.md or data/sudoku_easy.py that names one experiment built by
    data.sudoku_easy and says "N blanks" says its data.build_args' `blanks`. Text only."""
    import re

    import yaml

    blanks = {}
    for name in EXPERIMENTS:
        doc = yaml.safe_load(pathlib.Path(CONFIG_DIR, "experiment", f"{name}.yaml").read_text())
        args = dict(a.split("=", 1) for a in (doc.get("data") or {}).get("build_args", []))
        if "blanks" in args:
            blanks[name] = int(args["blanks"])
    assert {"trm_sudoku_tiny", "trm_sudoku_cpu"} <= set(blanks)
    root = pathlib.Path(CONFIG_DIR).parent
    files = [
        root / "README.md",
        *sorted((root / "docs").glob("*.md")),
        root / "data/sudoku_easy.py",
    ]
    checked = 0
    for path in files:
        for line in path.read_text().splitlines():
            named = [n for n in blanks if re.search(rf"\b{n}\b", line)]
            said = [int(n) for n in re.findall(r"\b(\d+) blanks\b", line)]
            if len(named) == 1 and said:
                assert set(said) == {blanks[named[0]]}, (path.name, line[:120])
                checked += 1
    assert checked >= 6


def test_missing_experiment_says_what_to_do():
    with pytest.raises(ConfigError, match=r"\+experiment"):
        load_config([])


def test_unknown_model_field_names_the_field():
    """Rejected while composing (TRMTask.validate_config checks the model keys against
    TRMConfig), with the close match."""
    with pytest.raises(ConfigError, match="hidden_sise.*did you mean 'hidden_size'"):
        load_config(["+experiment=trm_sudoku_tiny", "+model.hidden_sise=3"])


def _error(overrides, **kw) -> str:
    with pytest.raises(ConfigError) as e:
        (compose if kw else load_config)(overrides, **kw)
    return str(e.value)


@pytest.mark.parametrize(
    "key, close",
    [
        ("model.n_layr", "L_layers"),
        ("trainer.steps", "max_steps"),
        ("data.pth", "path"),
        ("modl", "model"),
    ],
)
def test_an_unknown_key_is_one_line_in_every_section(key, close):
    """A misspelt key, given as an override or added with `+`, is the same one line: the key, a
    close match and the section's keys; never Hydra's advice to add the typo with `+`."""
    plain = _error(["+experiment=trm_sudoku_tiny", f"{key}=3"])
    added = _error(["+experiment=trm_sudoku_tiny", f"+{key}=3"])
    assert plain == added, (plain, added)
    section, name = key.rpartition(".")[::2]
    assert plain.startswith(f"{section or 'config'}: unknown key(s) ['{name}']"), plain
    assert f"did you mean '{close}'?" in plain and " accepts [" in plain, plain
    assert "+" not in plain and "\n" not in plain, plain


def test_unknown_keys_under_hydra_and_lists():
    """Hydra's own section gets the same line for a typo and keeps its `+key` advice for a key
    that is really new (a free-form mapping: hydra.job.env_set); a list indexed by a name says
    what its items are. One line each, no traceback."""
    tiny = "+experiment=trm_sudoku_tiny"
    typo = _error([tiny, "hydra.job.nme=1"], hydra_config=True)
    assert typo.startswith("hydra.job: unknown key(s) ['nme'] ('nme' -> did you mean 'name'?)")
    new = _error([tiny, "hydra.job.env_set.FOO=1"], hydra_config=True)
    assert "To append to your config use +hydra.job.env_set.FOO=1" in new, new
    compose([tiny, "+hydra.job.env_set.FOO=1"], hydra_config=True)  # as Hydra says
    lst = _error([tiny, "mesh.rules.x=3"])
    assert (
        lst
        == "config error: mesh.rules.x: mesh.rules is a list; its items are mesh.rules.0 to mesh.rules.0"
    )
    assert "+experiment=NAME" in _error(["model.n_layr=3"])


@pytest.mark.parametrize(
    "override, line",
    [
        ("task=trm", "task: moved to family"),
        ("trainer.epochs=3", "trainer.epochs: moved to data.epochs"),
    ],
)
def test_a_moved_key_is_one_line_naming_its_new_place(override, line):
    """A key that moved (the family's name; a family's knob that left the trainer section for
    its own) is one line naming where it is now, given as an override or added with `+` (without
    an experiment, naming the family whose knob it is)."""
    tiny = "+experiment=trm_sudoku_tiny"
    assert _error([tiny, override]) == line
    assert _error([tiny, f"+{override}"]) == line
    if override.startswith("trainer."):  # no family yet: the family that moved it is named
        assert _error([override]) == f"{line} (family trm)"


def test_mesh_presets():
    cfg = load_config(["+experiment=trm_sudoku_tiny", "mesh=v4-64"])
    assert mesh_shape(cfg.mesh, 32) == (1, 32, 1)
    with pytest.raises(ValueError, match="needs 32 devices"):
        mesh_shape(cfg.mesh, 8)
    cfg = load_config(["+experiment=trm_sudoku_tiny"])
    mesh = make_mesh(cfg.mesh)  # cpu preset: all 8 test devices on fsdp, Auto axis types
    assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_x64_is_needed_only_for_trm_with_the_float64_loss():
    """Every command takes one decision (train.families.make_task asks the family:
    Task.needs_x64)."""
    from train.families import family

    def needs_x64(cfg):
        return family(cfg.family).task.needs_x64(cfg)

    assert needs_x64(load_config(["+experiment=trm_sudoku_tiny"]))  # upstream's default loss
    assert not needs_x64(load_config(["+experiment=trm_sudoku_tiny", "model.loss_dtype=float32"]))
    assert not needs_x64(load_config(["+experiment=gpt_shakespeare_char_tiny"]))


@pytest.mark.parametrize("experiment", ["trm_sudoku_tiny", "hrm_sudoku"])
def test_remat_and_scan_are_plain_overrides(experiment):
    """The model section composes on TRMConfig's defaults (trm_defaults), so remat/scan are there:
    no leading '+' is needed."""
    cfg = load_config([f"+experiment={experiment}", "model.remat=true", "model.scan=true"])
    assert cfg.model.remat is True and cfg.model.scan is True
    assert load_config([f"+experiment={experiment}"]).model.remat is False


@pytest.mark.parametrize(
    "experiment", ["trm_sudoku_tiny", "trm_sudoku_att", "hrm_sudoku", "gpt_shakespeare_char_tiny"]
)
def test_attention_impl_overrides_from_the_command_line(experiment, x64):
    """The model section composes on its dataclass's defaults, attention_impl among them (auto):
    a plain override reaches the model config (a '+' is refused: the key is there), and a bad
    value is an error naming the field and the choices (x64: the TRM task builds the float64
    loss, as the trainer enables it)."""
    from train.families import make_task

    assert load_config([f"+experiment={experiment}"]).model.attention_impl == "auto"
    with pytest.raises(ConfigError, match="An item is already at 'model.attention_impl'"):
        load_config([f"+experiment={experiment}", "+model.attention_impl=explicit"])
    cfg = load_config([f"+experiment={experiment}", "model.attention_impl=explicit"])
    task = make_task(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]), need_data=False)
    assert task.model_cfg.attention_impl == "explicit"
    bad = load_config([f"+experiment={experiment}", "model.attention_impl=flash"])
    with pytest.raises(Exception, match=r"attention_impl.*flash.*explicit"):
        make_task(bad, make_mesh(bad.mesh, devices=jax.devices()[:1]), need_data=False)


@pytest.mark.parametrize("experiment", ["gpt2_124m", "gpt_shakespeare_char"])
def test_gelu_approximate_is_a_plain_override(experiment):
    """The model section composes on GPTConfig's defaults, gelu_approximate among them (false,
    nanoGPT's erf GELU), so the tanh GELU that HF GPT-2 weights need is `model.gelu_approximate=true`, without a '+'."""
    assert load_config([f"+experiment={experiment}"]).model.gelu_approximate is False
    cfg = load_config([f"+experiment={experiment}", "model.gelu_approximate=true"])
    assert cfg.model.gelu_approximate is True


def test_section_yamls_hold_only_what_they_change():
    """Each configs/{model,optim,data}/*.yaml composes on a registered family's dataclass defaults
    (`<family>_defaults`) and sets only keys whose value differs from the default: a default is
    stated once, in the dataclass."""
    import yaml

    from train.config import section_defaults
    from train.families import family

    checked = 0
    for section in ("model", "optim", "data"):
        for path in sorted(pathlib.Path(CONFIG_DIR, section).glob("*.yaml")):
            doc = yaml.safe_load(path.read_text())
            bases = [d for d in doc.pop("defaults", []) if str(d).endswith("_defaults")]
            assert len(bases) == 1, f"{path}: no <family>_defaults in its defaults list"
            cls, filled = family(bases[0].removesuffix("_defaults")).task.config_sections[section]
            defaults = section_defaults(cls, filled)
            same = [k for k, v in doc.items() if k in defaults and defaults[k] == v]
            assert not same, f"{path}: {same} restate the defaults of {cls.__name__}"
            checked += 1
    assert checked >= 13


def test_a_run_of_an_older_version_opens_with_the_keys_added_since_at_their_defaults():
    """A run directory's config.yaml written before a key of the trainer's sections existed
    (run.xla_flags, checkpoint.keep_best here), or with keys that moved since (`task:` for
    `family:`, a family's knobs once in the trainer section), opens for train.evaluate / sample /
    export with the new keys at their defaults and the moved ones in their places (a former
    trainer key the family never read is dropped); one without a whole section, or with a value of
    the wrong type, is one ConfigError line. `mesh=NAME` on a saved config swaps in that preset,
    its platform included, and leaves the model as the run had it."""
    from omegaconf import OmegaConf

    from train.compose import load_run_config

    cfg = load_config(["+experiment=trm_sudoku_tiny"])
    saved = OmegaConf.to_container(cfg, resolve=True)
    del saved["run"]["xla_flags"], saved["checkpoint"]["keep_best"]
    saved["task"] = saved.pop("family")  # as an older version wrote them
    saved["trainer"].update(epochs=saved["data"].pop("epochs"), eval_iters=0)
    saved["trainer"]["gradient_accumulation_steps"] = 1
    opened = load_run_config(OmegaConf.to_yaml(saved))
    assert opened.run.xla_flags == "" and opened.checkpoint.keep_best is True
    assert opened.model == cfg.model and opened.trainer == cfg.trainer
    # mesh=NAME swaps in a preset, its platform with it; the saved loss is what the run computed
    tpu = load_run_config(OmegaConf.to_yaml(saved), ["mesh=v4-64"])
    assert (tpu.mesh.fsdp, tpu.mesh.platform, tpu.model.loss_dtype) == (32, "tpu", "float64")
    back = OmegaConf.to_yaml(OmegaConf.to_container(tpu, resolve=True))
    assert load_run_config(back, ["mesh=cpu"]).mesh.platform == ""
    assert opened.family == "trm" and opened.data == cfg.data and opened.data.epochs == 320
    gpt = OmegaConf.to_container(load_config(["+experiment=gpt_shakespeare_char_tiny"]))
    gpt["task"] = gpt.pop("family")
    gpt["trainer"].update(
        epochs=0,
        eval_iters=gpt["data"].pop("eval_iters"),
        gradient_accumulation_steps=gpt["data"].pop("gradient_accumulation_steps"),
    )
    opened = load_run_config(OmegaConf.to_yaml(gpt))
    assert "epochs" not in opened.trainer and "eval_iters" not in opened.trainer
    assert (opened.data.eval_iters, opened.data.gradient_accumulation_steps) == (20, 1)
    with pytest.raises(ConfigError, match="^no 'run' section; expected the config.yaml"):
        load_run_config("task: trm\n")
    saved["trainer"]["max_steps"] = "many"
    with pytest.raises(ConfigError, match="max_steps") as e:
        load_run_config(OmegaConf.to_yaml(saved))
    assert "\n" not in str(e.value)
