"""`python -m bench curves` (bench/curves.py): what it hands upstream, and how it judges a run.

- upstream_trm_overrides: the upstream side of `trm_sudoku_cpu` gets our composed settings. Proven
  against upstream's own config schema: every key it sets exists in an all_config.yaml that
  upstream's pretrain.py wrote (tests/goldens/trm_train/), and reading the result back through
  train.families.trm.weights.upstream_overrides (the way `train.evaluate` reads an upstream run) gives our model,
  loss, batch and EMA settings again; the optimiser and schedule keys carry our values.
- upstream_sources: each checkout is recognised by its files; anything else is one line naming it.
- summarise: "within spread" is the JAX mean inside upstream's [min, max] at the same step, and
  the time to target is the first evaluation at or past it (median over seeds).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from bench.curves import CURVES, summarise, trainer_config, upstream_sources, upstream_trm_overrides
from train.errors import ConfigError
from train.families.trm.weights import upstream_overrides

ALL_CONFIG = Path(__file__).parent / "goldens/trm_train/trm_train_mlp_t_checkpoint/all_config.yaml"


def _upstream_config_for(cfg: dict) -> dict:
    """An upstream all_config.yaml with our settings applied as Hydra would apply the overrides."""
    base = OmegaConf.create(yaml.safe_load(ALL_CONFIG.read_text()))
    OmegaConf.set_struct(base, True)  # an override of a key upstream does not have fails
    for o in upstream_trm_overrides(cfg):
        key, value = o.split("=", 1)
        OmegaConf.update(base, key, yaml.safe_load(value), merge=False)
    return OmegaConf.to_container(base)


def test_upstream_trm_overrides_carry_our_settings_into_upstreams_schema():
    cfg = trainer_config(CURVES["trm_sudoku_cpu"].experiment)
    up = _upstream_config_for(cfg)
    for k in ("lr", "lr_min_ratio", "lr_warmup_steps", "beta1", "beta2", "weight_decay"):
        assert up[k] == pytest.approx(cfg["optim"][k]), k
    for k in ("puzzle_emb_lr", "puzzle_emb_weight_decay", "ema", "ema_rate"):
        assert up[k] == cfg["optim"][k], k
    assert up["global_batch_size"] == cfg["trainer"]["global_batch_size"]
    assert up["epochs"] == cfg["data"]["epochs"]
    assert up["eval_interval"] == cfg["data"]["eval_interval_epochs"]
    assert up["evaluators"] == []
    # read back the way train.evaluate reads an upstream run's all_config.yaml
    back = dict(o.split("=", 1) for o in upstream_overrides(up))
    for k, v in cfg["model"].items():
        if f"model.{k}" in back:
            assert yaml.safe_load(back[f"model.{k}"]) == v, k
    read_back = {k.split(".", 1)[1] for k in back if k.startswith("model.")}
    assert {
        "hidden_size",
        "L_layers",
        "H_cycles",
        "L_cycles",
        "halt_max_steps",
        "mlp_t",
    } <= read_back
    assert back["model.loss_type"] == cfg["model"]["loss_type"]
    assert int(back["trainer.global_batch_size"]) == cfg["trainer"]["global_batch_size"]
    assert yaml.safe_load(back["optim.ema"]) == cfg["optim"]["ema"]


def test_upstream_sources_recognises_each_checkout(tmp_path):
    nano, trm, adam, other = (tmp_path / n for n in ("nanoGPT", "TRM", "adam", "other"))
    for d, files in (
        (nano, ("train.py", "model.py")),
        (trm, ("pretrain.py", "puzzle_dataset.py")),
        (adam, ("adam_atan2/adam_atan2.py",)),
        (other, ("README.md",)),
    ):
        for f in files:
            (d / f).parent.mkdir(parents=True, exist_ok=True)
            (d / f).write_text("")
    assert upstream_sources([str(nano), str(trm), str(adam)]) == {
        "nanogpt": nano.resolve(),
        "trm": trm.resolve(),
        "adam_atan2": adam.resolve(),
    }
    with pytest.raises(ConfigError, match=f"--upstream-src {other}: not a nanoGPT"):
        upstream_sources([str(other)])


def _run(values, t0=10.0):
    return {
        "evals": [
            {"step": 100 * (i + 1), "value": v, "t": t0 * (i + 1)} for i, v in enumerate(values)
        ]
    }


def test_summarise_judges_spread_and_time_to_target():
    curve = CURVES["gpt_shakespeare_char_cpu"]  # lower is better, target 2.0
    runs = {
        "upstream": {"1": _run([2.4, 2.1, 1.9]), "2": _run([2.5, 2.0, 1.95])},
        "jax": {"1": _run([2.45, 2.2, 1.97], t0=20.0), "2": _run([2.46, 2.3, 2.01], t0=20.0)},
    }
    s = summarise(curve, runs)
    within = [r["jax_within_spread"] for r in s["per_step"]]
    assert within == [True, False, False]  # 2.455 in [2.4, 2.5]; 2.25 > 2.1; 1.99 > 1.95
    assert s["within_spread"] == "1/3"
    assert s["per_step"][2]["jax"] == {
        "mean": pytest.approx(1.99),
        "min": 1.97,
        "max": 2.01,
        "n": 2,
    }
    # upstream: seed 1 at 30 s (1.9), seed 2 at 20 s (2.0 <= 2.0); jax: only seed 1, at 60 s
    assert s["time_to_target"]["upstream"] == {"median_s": 25.0, "reached": 2, "seeds": 2}
    assert s["time_to_target"]["jax"] == {"median_s": 60.0, "reached": 1, "seeds": 2}
