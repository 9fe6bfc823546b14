"""Upstream TRM's checkpoint files that train/source.py opens (train.evaluate, train.export): a
torch state_dict of `model.*` keys (`_orig_mod.` ok), configured by the all_config.yaml upstream
saves beside it (`upstream_overrides`) or by overrides naming an experiment; its vocabulary and
puzzle identifiers come from its own tables, seq_len from the data set's test split.
"""

from __future__ import annotations

import os

import yaml
from omegaconf import open_dict

from parity.trm_params import PUZZLE_KEY
from train.families.trm.data import test_metadata
from train.source import SourceError, compose_for, has_experiment, validate_for
from train.task import Opened, WeightsFile

# upstream arch module names (config/arch/*.yaml `name`) -> TRMConfig.arch
_UPSTREAM_ARCH = {"trm_singlez", "trm_hier6", "transformers_baseline", "hrm", "trm"}
_UPSTREAM_MODEL_KEYS = (
    "H_cycles", "L_cycles", "H_layers", "L_layers", "hidden_size", "expansion", "num_heads",
    "pos_encodings", "rms_norm_eps", "rope_theta", "halt_max_steps", "halt_exploration_prob",
    "forward_dtype", "mlp_t", "puzzle_emb_ndim", "puzzle_emb_len", "no_ACT_continue",
    "act_enabled", "act_inference",
)  # fmt: skip


class UpstreamTRMCheckpoint(WeightsFile):
    kind = "upstream_trm"
    description = "an upstream TRM checkpoint"

    def detect(self, path: str, loaded) -> bool:
        keys = [k.removeprefix("_orig_mod.") for k in loaded] if isinstance(loaded, dict) else []
        return bool(keys) and all(k.startswith("model.") for k in keys)

    def open(self, path, loaded, data, overrides) -> Opened:
        """all_config.yaml beside the checkpoint (then `overrides`), or `overrides` alone naming
        an experiment; vocabulary and puzzle identifiers from the checkpoint's own tables,
        seq_len from the data set's test split."""
        beside = os.path.join(os.path.dirname(os.path.abspath(path)), "all_config.yaml")
        base = []
        if os.path.isfile(beside):
            with open(beside) as f:
                base = upstream_overrides(yaml.safe_load(f) or {})
        elif not has_experiment(overrides):
            raise SourceError(
                f"{path}: no all_config.yaml beside it; pass the run's config as overrides, "
                "e.g. +experiment=trm_sudoku (and model.* / data.path=...)"
            )
        trained = [o.split("=", 1)[1] for o in base + overrides if o.startswith("data.path=")]
        cfg = compose_for(
            path, base + overrides + ([f"data.path={data}"] if data is not None else [])
        )
        sd = {k.removeprefix("_orig_mod."): v for k, v in loaded.items()}
        vocab, table = sd.get("model.inner.embed_tokens.embedding_weight"), sd.get(PUZZLE_KEY)
        meta = test_metadata(cfg.data.path)
        with open_dict(cfg.data):
            cfg.data.seq_len = meta.seq_len
            cfg.data.vocab_size = int(vocab.shape[0]) if vocab is not None else meta.vocab_size
            cfg.data.num_puzzle_identifiers = (
                int(table.shape[0]) if table is not None else meta.num_puzzle_identifiers
            )
        validate_for(path, cfg)
        return Opened(cfg, trained_on=trained[-1] if trained else None)


def upstream_overrides(all_config: dict) -> list[str]:
    """Our Hydra overrides for the run an upstream all_config.yaml describes (model from `arch`,
    loss type, batch size, EMA, data_paths[0], the ARC evaluator)."""
    arch = dict(all_config.get("arch") or {})
    module = str(arch.get("name", "recursive_reasoning.trm@")).split("@")[0].split(".")[-1]
    if module not in _UPSTREAM_ARCH:
        raise SourceError(
            f"all_config.yaml: arch.name={arch.get('name')!r} is not a known TRM arch"
        )
    out = ["task=trm", "model=trm", "optim=trm", "data=sudoku", f"model.arch={module}"]
    out += [f"model.{k}={arch[k]}" for k in _UPSTREAM_MODEL_KEYS if k in arch]
    loss = (arch.get("loss") or {}).get("loss_type")
    if loss:
        out.append(f"model.loss_type={loss}")
    if "global_batch_size" in all_config:
        out.append(f"trainer.global_batch_size={int(all_config['global_batch_size'])}")
    if "ema" in all_config:
        out.append(f"optim.ema={bool(all_config['ema'])}")
    paths = all_config.get("data_paths_test") or all_config.get("data_paths") or []
    if paths:
        out.append(f"data.path={paths[0]}")
    if any("arc" in str(e.get("name", "")).lower() for e in all_config.get("evaluators") or []):
        out.append("data.evaluator=arc")
    return out + ["run.name=upstream_eval", "trainer.epochs=1", "data.eval_interval_epochs=1"]
