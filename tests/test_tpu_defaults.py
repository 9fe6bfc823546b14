"""The v4-64 defaults are the recommended ones, and what a TPU cannot run is refused in one line.

`mesh=v4-64` replicates params (docs/sharding.md, "Defaults on a v4-64") and says its platform,
`mesh.platform: tpu`, which gives a family its TPU defaults (Task.platform_defaults; TRM: the
float32 loss, docs/sharding.md, "float64 on a TPU") under any experiment, a new one included;
`mesh=cpu` / `mesh=gpu` keep upstream's float64. `TRMTask.check_backend` (which
train.families.make_task asks first) refuses the float64 loss on a TPU. Composition only: no
compile.
"""

from __future__ import annotations

import glob
import os
import shutil

import pytest

from tests.helpers import REPO
from train.compose import CONFIG_DIR, load_config
from train.config import ConfigError
from train.families import family


def check_backend(cfg, platform: str) -> None:
    family(cfg.family).task.check_backend(cfg, platform)


EXPERIMENTS = sorted(
    os.path.splitext(os.path.basename(p))[0]
    for p in glob.glob(os.path.join(REPO, "configs", "experiment", "*.yaml"))
)
TRM_EXPERIMENTS = [e for e in EXPERIMENTS if load_config([f"+experiment={e}"]).family == "trm"]


def test_the_experiment_lists_are_not_empty():
    assert "trm_sudoku" in TRM_EXPERIMENTS and "gpt2_124m" in EXPERIMENTS
    assert "gpt2_124m" not in TRM_EXPERIMENTS


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_mesh_v4_64_gives_the_recommended_settings_that_a_tpu_accepts(experiment):
    """The plain `+experiment=NAME mesh=v4-64` is a run a TPU accepts, with params replicated
    (every experiment: a new one is checked without editing this test)."""
    cfg = load_config([f"+experiment={experiment}", "mesh=v4-64"])
    assert (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor) == (1, 32, 1)
    assert cfg.mesh.param_sharding == "replicate"
    check_backend(cfg, "tpu")  # raises ConfigError for a float64 loss
    if cfg.family == "trm":
        assert cfg.model.loss_dtype == "float32"


@pytest.mark.parametrize("experiment", TRM_EXPERIMENTS)
def test_other_meshes_keep_upstreams_float64_loss(experiment):
    """mesh=gpu here; mesh=cpu, the default, in test_a_float64_loss_on_a_tpu_is_refused_in_one_line
    and in test_a_new_experiment_needs_nothing_for_a_tpu_and_its_own_value_wins."""
    cfg = load_config([f"+experiment={experiment}", "mesh=gpu"])
    assert cfg.mesh.platform == "" and cfg.model.loss_dtype == "float64"
    check_backend(cfg, "gpu")  # GPUs and CPUs have float64
    check_backend(cfg, "cpu")


def test_a_new_experiment_needs_nothing_for_a_tpu_and_its_own_value_wins(tmp_path):
    """The TPU's float32 loss is the mesh's rule, not a file per experiment: an experiment
    written now (its file alone, in a copy of configs/) gets float32 on `mesh=v4-64` and
    upstream's float64 elsewhere. The rule is the lowest layer: an experiment that states
    model.loss_dtype keeps its value on a TPU mesh too (and float64 is then refused there)."""
    configs = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, configs)
    new = (configs / "experiment" / "trm_sudoku.yaml").read_text()
    (configs / "experiment" / "trm_new.yaml").write_text(new.replace("pretrain_mlp_t_sudoku", "n"))
    stated = new.replace("\nmodel:\n", "\nmodel:\n  loss_dtype: float64\n", 1)
    assert stated != new
    (configs / "experiment" / "trm_stated.yaml").write_text(stated)

    def composed(name, mesh):
        return load_config([f"+experiment={name}", f"mesh={mesh}"], config_dir=str(configs))

    tpu = composed("trm_new", "v4-64")
    assert tpu.mesh.platform == "tpu" and tpu.model.loss_dtype == "float32"
    check_backend(tpu, "tpu")
    assert composed("trm_new", "cpu").model.loss_dtype == "float64"
    stated = composed("trm_stated", "v4-64")
    assert stated.model.loss_dtype == "float64"
    with pytest.raises(ConfigError, match="set model.loss_dtype=float32"):
        check_backend(stated, "tpu")


def test_the_experiments_own_values_and_the_command_line_still_win():
    """mesh=v4-64 changes the mesh and, through mesh.platform, only the keys a family defaults
    otherwise on a TPU; a command-line override wins over both."""
    cfg = load_config(
        [
            "+experiment=trm_sudoku",
            "mesh=v4-64",
            "mesh.param_sharding=fsdp",
            "model.loss_dtype=float64",
            "optim.lr=3e-4",
        ]
    )
    assert cfg.mesh.param_sharding == "fsdp" and cfg.model.loss_dtype == "float64"
    assert cfg.optim.lr == 3e-4
    # everything else of the experiment is untouched by mesh=v4-64
    plain = load_config(["+experiment=trm_sudoku"])
    tpu = load_config(["+experiment=trm_sudoku", "mesh=v4-64"])
    assert {k: v for k, v in tpu.model.items() if k != "loss_dtype"} == {
        k: v for k, v in plain.model.items() if k != "loss_dtype"
    }
    assert tpu.optim == plain.optim and tpu.trainer == plain.trainer


def test_a_float64_loss_on_a_tpu_is_refused_in_one_line():
    cfg = load_config(["+experiment=trm_sudoku"])  # mesh=cpu: float64, e.g. on a single TPU VM
    with pytest.raises(ConfigError) as e:
        check_backend(cfg, "tpu")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("model.loss_dtype=float64")
    assert "set model.loss_dtype=float32" in message


def test_gpt_runs_pass_the_backend_check_everywhere():
    cfg = load_config(["+experiment=gpt_shakespeare_char_tiny"])
    for platform in ("cpu", "gpu", "tpu"):
        check_backend(cfg, platform)


def test_mesh_v4_64_without_an_experiment_names_the_experiment():
    with pytest.raises(ConfigError, match="experiment"):
        load_config(["mesh=v4-64"])
