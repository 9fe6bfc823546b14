"""Upstream TRM's checkpoint files that train/source.py opens (train.evaluate, train.export): a
torch state_dict of `model.*` keys (`_orig_mod.` ok), configured by the all_config.yaml upstream
saves beside it (`upstream_overrides`) or by overrides naming an experiment; its vocabulary and
puzzle identifiers come from its own tables, seq_len from the data set's test split.
"""

from __future__ import annotations

import os
import re

import yaml
from omegaconf import open_dict

from parity.trm_params import PUZZLE_KEY
from train.compose import override
from train.errors import one_line
from train.families.trm.data import test_metadata
from train.families.trm.task import variant_description
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

    def kind_of(self, loaded, task) -> str:
        extra = task.keys_upstream_lacks(loaded)
        return variant_description(extra) if extra else self.kind

    def open(self, path, loaded, data, overrides) -> Opened:
        """all_config.yaml beside the checkpoint (then `overrides`), or `overrides` alone naming
        an experiment; vocabulary and puzzle identifiers from the checkpoint's own tables,
        seq_len from the data set's test split."""
        beside = os.path.join(os.path.dirname(os.path.abspath(path)), "all_config.yaml")
        base = []
        if os.path.isfile(beside):
            base = upstream_overrides(_read_all_config(beside), beside)
        elif not has_experiment(overrides):
            raise SourceError(
                f"{path}: no all_config.yaml beside it; pass the run's config as overrides, "
                "e.g. +experiment=trm_sudoku (and model.* / data.path=...)"
            )
        trained = [o.split("=", 1)[1] for o in base + overrides if o.startswith("data.path=")]
        cfg = compose_for(
            path, base + overrides + ([override("data.path", data)] if data is not None else [])
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


def _read_all_config(path: str) -> dict:
    """all_config.yaml as a mapping; SourceError naming the file otherwise. yaml.safe_load: a
    Python tag is refused, never constructed."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = yaml.safe_load(f)
    except yaml.constructor.ConstructorError as e:
        if "python/" in str(e.problem):  # a Python tag: construction would run code
            raise SourceError(
                f"refusing to load {path}: it asks to run code ({' '.join(str(e.problem).split())})"
            ) from e
        raise SourceError(f"{path}: not a YAML file this reads ({one_line(e, 200)})") from e
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SourceError(f"{path}: not a YAML file this reads ({one_line(e, 200)})") from e
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise SourceError(
            f"{path}: expected a mapping of upstream's config keys (arch, data_paths, ...), "
            f"got a {type(obj).__name__}"
        )
    return obj


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _number_if_written(value):
    """A string that spells a number as the number: YAML 1.1 (PyYAML) reads `1e-05`, written
    without a dot, as a string, which upstream's config (pydantic) turns into the float."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        text = value.strip()
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text)
    return value


def upstream_overrides(all_config: dict, where: str = "all_config.yaml") -> list[str]:
    """Our Hydra overrides for the run an upstream all_config.yaml describes (model from `arch`,
    loss type, batch size, EMA, data_paths[0], the ARC evaluator). SourceError naming `where`
    and the key for a value of another shape than upstream writes."""

    def get(obj, key, kinds, what):
        value = obj.get(key)
        if value is not None and not isinstance(value, kinds):
            raise SourceError(f"{where}: {key}: expected {what}, got {value!r:.80}")
        return value

    scalar = (bool, int, float, str)
    arch = dict(get(all_config, "arch", dict, "a mapping") or {})
    name = get(arch, "name", str, "upstream's arch name") or "recursive_reasoning.trm@"
    module = name.split("@")[0].split(".")[-1]
    if module not in _UPSTREAM_ARCH:
        raise SourceError(f"{where}: arch.name={name!r} is not a known TRM arch")
    out = ["family=trm", "model=trm", "optim=trm", "data=sudoku", override("model.arch", module)]
    out += [
        override(
            f"model.{k}",
            _number_if_written(get(arch, k, scalar, "a number, a string or a boolean")),
        )
        for k in _UPSTREAM_MODEL_KEYS
        if k in arch
    ]
    loss = get(get(arch, "loss", dict, "a mapping") or {}, "loss_type", str, "a name")
    if loss:
        out.append(override("model.loss_type", loss))
    batch = get(all_config, "global_batch_size", int, "a whole number")
    if batch is not None:
        out.append(override("trainer.global_batch_size", batch))
    ema = get(all_config, "ema", bool, "true or false")
    # upstream's default when the file does not say (cfg_pretrain.yaml: ema False)
    out.append(override("optim.ema", False if ema is None else ema))
    paths = [
        get(all_config, k, list, "a list of data set paths") or []
        for k in ("data_paths_test", "data_paths")
    ]
    paths = paths[0] or paths[1]
    if paths:
        if not isinstance(paths[0], str):
            raise SourceError(f"{where}: data_paths: expected paths, got {paths[0]!r:.80}")
        out.append(override("data.path", paths[0]))
    evaluators = get(all_config, "evaluators", list, "a list") or []
    if any(isinstance(e, dict) and "arc" in str(e.get("name", "")).lower() for e in evaluators):
        out.append("data.evaluator=arc")
    return out + ["run.name=upstream_eval", "data.epochs=1", "data.eval_interval_epochs=1"]
