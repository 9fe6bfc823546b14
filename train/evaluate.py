"""Evaluate a checkpoint: ours, upstream TRM's or nanoGPT's (docs/evaluation.md).

    python -m train.evaluate SOURCE [--step N] [--data PATH] [--json OUT.json] [--batch B]
                             [family options] [overrides ...]

SOURCE is anything train.source.open_source opens:
  * a run directory of `python -m train.main` (config.yaml + checkpoints/): its latest checkpoint
    or --step N;
  * a checkpoint file of a family's original code base: an upstream TRM state_dict (its config
    from the all_config.yaml upstream saves beside it, or from `+experiment=NAME` overrides), a
    nanoGPT ckpt.pt or an HF GPT-2 .safetensors.

The report is the family's (its Evaluation, train/task.py), computed by the trainer's own
evaluation loop, so a run's last logged eval and this tool agree exactly on the same checkpoint,
data and batch size. --data: the data set to evaluate on (default: the run's own). What each
family reports, the data it takes and its own options follow (train/families/<family>/evaluate.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile

from train import families, gcs
from train.cli import FamilyCommand
from train.errors import ConfigError, exit_with, output_file

log = logging.getLogger(__name__)


# --- the library entry -------------------------------------------------------------------------
def evaluate(source: str, *, step: int | None = None, data: str | None = None,
             batch: int | None = None, overrides=(), save_dir: str | None = None,
             progress: bool = False, **options) -> dict:  # fmt: skip
    """The report `python -m train.evaluate` prints and writes (--json): see the module
    docstring. `options`: the source family's own (TRM: extra_steps, halt, show). Raises
    ConfigError (one line) on bad input."""
    return _evaluate(source, step=step, data=data, batch=batch, overrides=overrides,
                     save_dir=save_dir, progress=progress, **options)[0]  # fmt: skip


def _evaluate(source: str, *, step, data, batch, overrides, save_dir, progress, **options):
    """-> (report, the source family's Evaluation)."""
    import jax

    from train.source import open_source

    with tempfile.TemporaryDirectory() as tmp:
        if data is not None:
            data = _converted(data, tmp)
        src = open_source(source, step=step, data=data, overrides=overrides)
        evaluation = families.family(src.cfg.family).evaluation
        _check_options(evaluation, src.cfg.family, options)
        report = {"source": source, "kind": src.kind}
        if src.kind == "run":
            report["step"] = src.step
        if evaluation.needs_data:
            own = src.cfg.data.get("path") or None  # the run's (or the file's config's) data set
            data = data or own
            if data is None or not os.path.exists(data):
                raise ConfigError(f"data.path={own!r} is not on disk; pass --data PATH")
            report["data"] = data
        with jax.set_mesh(src.task.mesh):
            report.update(
                evaluation.report(
                    src, data, batch=batch, save_dir=save_dir, progress=progress, **options
                )  # fmt: skip
            )
    return report, evaluation


def _converted(data: str, tmp: str) -> str:
    """`data` as the first registered family that converts such a file writes it (TRM: a Sudoku
    CSV into a test split), else unchanged."""
    for fam in families.registered().values():
        converted = fam.evaluation.convert_data(data, tmp)
        if converted is not None:
            return converted
    return data


def option_defaults(evaluation) -> dict:
    """The family's own options (Evaluation.add_arguments) and their defaults, by dest."""
    parser = argparse.ArgumentParser(add_help=False)
    evaluation.add_arguments(parser)
    return vars(parser.parse_args([]))


def _check_options(evaluation, family: str, options: dict) -> None:
    """ConfigError naming the `options` that are not the source family's own."""
    foreign = sorted(set(options) - set(option_defaults(evaluation)))
    if foreign:
        flags = ", ".join("--" + k.replace("_", "-") for k in foreign)
        raise ConfigError(f"{flags}: not an option of this source's model family ({family})")


# --- output --------------------------------------------------------------------------------------
def format_table(report: dict, evaluation) -> str:
    """The report as the table `main` prints: the source, the data, the family's lines."""
    r = report
    lines = [
        f"source: {r['source']} ({r['kind']}" + (f", step {r['step']})" if "step" in r else ")")
    ]
    lines.append(f"data:   {r.get('data')}")
    return "\n".join(lines + evaluation.table(report))


def _add_common(p) -> None:
    p.add_argument("source", help="run directory, or a checkpoint file of the original code base")
    p.add_argument("--step", type=int, default=None, help="run directory: this checkpoint step")
    p.add_argument("--data", default=None, help="the data set to evaluate on (default: the run's)")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the report as JSON")
    p.add_argument("--batch", type=int, default=None, metavar="B", help="evaluation batch size")
    p.add_argument("overrides", nargs="*", help="config overrides (key=value, +experiment=NAME)")


COMMAND = FamilyCommand(
    "python -m train.evaluate", __doc__, _add_common, lambda f: f.evaluation, overrides=True
)


def main(argv=None) -> dict:
    gcs.configure()  # STORAGE_EMULATOR_HOST set: every gs:// client goes to that server
    from train.runtime import quiet_tpu_probe
    from train.source import source_family

    quiet_tpu_probe()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        args, _, options = COMMAND.parse(argv, source_family)  # the source family's options
        if args.json:
            output_file(args.json, "--json")  # before the evaluation, which may take hours
        save_dir = os.path.dirname(os.path.abspath(args.json)) if args.json else None
        report, evaluation = _evaluate(
            args.source, step=args.step, data=args.data, batch=args.batch,
            overrides=args.overrides, save_dir=save_dir, progress=sys.stderr.isatty(), **options,
        )  # fmt: skip
        print(format_table(report, evaluation))
        evaluation.finish(report, options)
    except ConfigError as e:
        exit_with(e)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
