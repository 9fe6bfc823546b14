"""TRM's part of `python -m train.evaluate` (docs/evaluation.md).

The numbers are upstream's (a fresh carry per batch, all halt_max_steps ACT steps, no early
halting, metrics of the last step, summed over the test split and divided by the count), computed
by the trainer's own evaluation loop (TRMTask.run_eval), so a run's last logged eval and this report
agree exactly on the same checkpoint, data and batch size. Its options are TRMEvalOptions, one
field each. On top: accuracy after every ACT step
(`per_step`), --extra-steps K more steps past halt_max_steps, --halt (the Q head halts rows, as in
training), --show N boards with the prediction after each step, --plot the accuracy per step,
--trajectories K --noise SIGMA [--select q_halt|vote] [--seed S]: test-time scaling, K noisy
trajectories per puzzle and one answer chosen (models/trm/scaling.py; docs/evaluation.md,
"Test-time scaling").
--data may be a data set in the upstream layout (its test split), a Sudoku CSV (Sudoku-Extreme
columns source,question,answer,rating), or an ARC data set (test_puzzles.json beside it: pass@K
with upstream's voting over augmentations).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import numpy as np

from data.arc_eval import ARCEvaluator
from data.puzzle_format import write_dataset
from data.puzzle_source import PuzzleTestDataset
from data.sudoku import check_sudoku_pairs, sudoku_split
from data.sudoku_sources import read_sudoku_csv
from models.trm.evaluation import LatentNoise, eval_step, noised_latents
from models.trm.modeling import INNERS
from models.trm.scaling import SELECT, Scaling, prefix_ks, trajectories_step
from train.errors import ConfigError, output_file
from train.families.trm.show import (
    check_plot_possible,
    puzzle_boards,
    render_text,
    save_accuracy_plot,
    save_gif,
    save_png,
    shown,
)
from train.mesh import check_batch_divisible
from train.task import Evaluation

PASS_KS_SHOWN = (1, 2, 5, 10)


def _option(default, help: str, **argparse_keywords):
    """A field of TRMEvalOptions: its default, and its command option's help and argparse
    keywords (a field whose default is False is a flag)."""
    return dataclasses.field(default=default, metadata={"help": help, **argparse_keywords})


@dataclasses.dataclass(frozen=True)
class TRMEvalOptions:
    """Every option of TRM's evaluation, in one place. A field is the command's option
    `--<field-name>` (`add_arguments` is derived from the fields), a keyword of the report
    (`TRMEvaluation.report`) and what `evaluate_trm` and the trainer's evaluation loop
    (TRMTask.run_eval) take whole; `check` refuses what cannot run, before any compute; `step`
    maps the options that change the jitted evaluation onto the model's functions (its outputs'
    shardings are derived: train.task.Task.output_shardings). A new filter or metric is its
    function (models/trm/evaluation.py) and one field here. Hashable: `step_key` is a jit cache
    key."""

    extra_steps: int = _option(0, "K more ACT steps past halt_max_steps", type=int, metavar="K")
    halt: bool = _option(False, "Q-head halting on (as in training)")
    show: int = _option(0, "print N puzzles with the prediction after every ACT step", type=int,
                        metavar="N")  # fmt: skip
    plot: str | None = _option(None, "accuracy vs ACT step", metavar="OUT.png")
    trajectories: int | None = _option(None, "test-time scaling: K noisy trajectories per puzzle",
                                       type=int, metavar="K")  # fmt: skip
    noise: float | None = _option(None, "their Gaussian noise on the latents before every ACT "
                                  "step", type=float, metavar="SIGMA")  # fmt: skip
    select: str | None = _option(None, "the answer: highest q_halt (default) or majority vote",
                                 choices=SELECT)  # fmt: skip
    seed: int | None = _option(None, "the noise's seed (default 0)", type=int)
    noise_latents: str | None = _option(None, "comma-separated latents to noise (default: the "
                                        "arch's z_L)", metavar="NAMES")  # fmt: skip

    @classmethod
    def add_arguments(cls, parser) -> None:
        """One command option per field, its dest the field's name."""
        for f in dataclasses.fields(cls):
            keywords = dict(f.metadata)
            if f.default is False:
                keywords["action"] = "store_true"
            else:
                keywords["default"] = f.default
            parser.add_argument("--" + f.name.replace("_", "-"), **keywords)

    @property
    def scaling(self) -> Scaling | None:
        """The test-time scaling the options ask for, checked (None: the plain evaluation)."""
        given = {"--noise": self.noise, "--select": self.select, "--seed": self.seed,
                 "--noise-latents": self.noise_latents}  # fmt: skip
        if self.trajectories is None and self.noise is None:
            extra = [k for k, v in given.items() if v is not None]
            if extra:
                raise ConfigError(f"{extra[0]}: only with --trajectories K (test-time scaling)")
            return None
        K, noise = (1 if self.trajectories is None else self.trajectories), self.noise
        if K < 1:
            raise ConfigError(f"--trajectories {K}: expected >= 1")
        if noise is not None and not noise >= 0:
            raise ConfigError(f"--noise {noise}: expected a standard deviation >= 0")
        if K > 1 and not noise:
            raise ConfigError(
                f"--trajectories {K} without noise runs {K} identical copies of one trajectory: "
                'add --noise SIGMA > 0 (docs/evaluation.md, "Test-time scaling")'
            )
        if self.show:
            raise ConfigError(
                "--show draws the plain recursion; it does not combine with --trajectories / "
                "--noise"
            )
        latents = tuple(self.noise_latents.split(",")) if self.noise_latents else None
        noise = LatentNoise(float(noise or 0.0), int(self.seed or 0), latents)
        return Scaling(K, noise, self.select or "q_halt")

    def check(self, arch: str) -> None:
        """ConfigError naming the option when a model of `arch` cannot be evaluated so."""
        if self.extra_steps < 0:
            raise ConfigError(f"--extra-steps {self.extra_steps}: expected >= 0")
        scaling = self.scaling
        if scaling is not None and scaling.noise.latents:
            names = INNERS[arch].latent_names
            unknown = [n for n in scaling.noise.latents if n not in names]
            if unknown:
                raise ConfigError(
                    f"--noise-latents {','.join(scaling.noise.latents)}: {unknown[0]!r} is not a "
                    f"latent of arch {arch} (its latents: {', '.join(names)})"
                )

    def step_key(self) -> tuple:
        """What `step` depends on."""
        return (self.extra_steps, self.halt, self.scaling)

    def step(self, graphdef):
        """The evaluation of one batch, (train state, batch) -> outputs: models/trm/evaluation.py's
        eval_step, or with test-time scaling models/trm/scaling.py's trajectories_step (the
        batch then holds "example": each row's index in the test split)."""
        scaling = self.scaling
        if scaling is None:
            return functools.partial(
                eval_step, graphdef, extra_steps=self.extra_steps, halt=self.halt
            )
        return functools.partial(
            trajectories_step, graphdef,
            trajectories=scaling.trajectories, noise=scaling.noise, select=scaling.select,
            extra_steps=self.extra_steps, halt=self.halt, ks=prefix_ks(scaling.trajectories),
        )  # fmt: skip


class TRMEvaluation(Evaluation):
    """upstream's evaluate on the test split of --data (a puzzle data set, a Sudoku CSV, or an ARC
    set: pass@K with upstream's voting): exact and token accuracy, Q-halt accuracy, mean steps,
    the accuracy after every ACT step; TRMEvalOptions on top."""

    needs_data = True

    def add_arguments(self, parser) -> None:
        TRMEvalOptions.add_arguments(parser)

    def convert_data(self, path: str, tmp_dir: str) -> str | None:
        if os.path.isfile(path) and path.endswith(".csv"):
            return sudoku_csv_dataset(path, os.path.join(tmp_dir, "sudoku_csv"))
        return None

    def report(self, src, data, *, batch=None, save_dir=None, progress=False, **options) -> dict:
        options = TRMEvalOptions(**options)
        options.scaling  # noqa: B018 (the scaling options' one line, before --plot's)
        if options.plot:
            check_plot_possible()
            output_file(options.plot, "--plot")
        return evaluate_trm(
            src.task, src.state, data, options, trained_on=src.trained_on, batch=batch,
            save_dir=save_dir, progress=progress,
        )  # fmt: skip

    def table(self, r: dict) -> list[str]:
        mode = "Q-head halting on" if r["halt"] else "no halting (upstream)"
        lines = [
            f"{r['count']} puzzles, {r['steps_run']} ACT steps (halt_max_steps "
            f"{r['halt_max_steps']} + {r['extra_steps']} extra), {mode}",
            f"exact accuracy   {r['exact_accuracy']:.4f}",
            f"token accuracy   {r['token_accuracy']:.4f}",
            f"q-halt accuracy  {r['q_halt_accuracy']:.4f}",
            f"mean steps       {r['mean_steps']:.2f}",
            f"lm loss          {r['lm_loss']:.4f}",
        ]
        lines += [f"pass@{k:<11d}{r[f'pass@{k}']:.4f}" for k in PASS_KS_SHOWN if f"pass@{k}" in r]
        if "trajectories" in r:
            lines += _trajectories_table(r["trajectories"])
        lines.append(
            "ACT step   exact   token" + ("  (every trajectory)" if "trajectories" in r else "")
        )
        ps = r["per_step"]
        for i, (e, t) in enumerate(zip(ps["exact_accuracy"], ps["token_accuracy"])):
            mark = (
                "  <- halt_max_steps" if i + 1 == r["halt_max_steps"] and r["extra_steps"] else ""
            )
            lines.append(f"{i + 1:8d}  {e:.4f}  {t:.4f}{mark}")
        return lines

    def finish(self, report: dict, options: dict) -> None:
        boards, note = report.pop("show", None) or ([], None)
        if note:
            print()
            print(note)
        halting = report["halt"]
        if boards:
            print()
            print(render_text(boards, halting=halting))
        path = options.get("plot")
        if path:
            save_accuracy_plot(report["per_step"], report["halt_max_steps"], path, report["source"])
            print(f"wrote {path}")
            if boards:
                stem = os.path.splitext(path)[0]
                print(f"wrote {save_png(boards, stem + '_show.png', halting)}")
                print(f"wrote {save_gif(boards, stem + '_show.gif', halting)}")


def sudoku_csv_dataset(csv_path: str, out_dir: str) -> str:
    """A Sudoku-Extreme CSV as the test split of an upstream-layout data set in `out_dir`."""
    try:
        records = read_sudoku_csv(csv_path)
    except (OSError, ValueError) as e:  # the file's line and what it expected
        raise ConfigError(f"--data {e}") from e
    if not len(records):
        raise ConfigError(f"{csv_path}: no puzzles (expected rows source,question,answer,rating)")
    check_sudoku_pairs(records.questions, records.answers, f"{csv_path} ")
    split = sudoku_split(records.questions, records.answers, np.ones(len(records), np.int64))
    write_dataset(out_dir, {"test": split}, ["<blank>"], overwrite=True)
    return out_dir


def _trajectories_table(t: dict) -> list[str]:
    lines = [
        f"test-time scaling: {t['trajectories']} trajectories, noise {t['noise']} on "
        f"{', '.join(t['latents'])}, select {t['select']}, seed {t['seed']}",
        "k          exact   token   oracle (any of k right)",
    ]
    for k, m in t["by_k"].items():
        lines.append(
            f"{k:<9d}  {m['exact_accuracy']:.4f}  {m['token_accuracy']:.4f}  "
            f"{m['oracle_exact_accuracy']:.4f}"
        )
    return lines


def _scaling_report(task, res: dict, scaling: Scaling) -> dict:
    """The report's `trajectories` block; with K > 1 the headline accuracies are the chosen
    answers' (K = 1: the plain evaluation's own, unchanged)."""
    noise, K = scaling.noise, scaling.trajectories
    latents = noise.latents or noised_latents(INNERS[task.model_cfg.arch].latent_names)
    block = {
        "trajectories": K,
        "noise": noise.sigma,
        "latents": list(latents),
        "select": scaling.select,
        "seed": noise.seed,
        "trajectory_count": int(res["trajectory_count"]),
        "by_k": {
            int(k): {
                "exact_accuracy": m["exact_accuracy"],
                "token_accuracy": m["accuracy"],
                "oracle_exact_accuracy": m["oracle_exact_accuracy"],
            }
            for k, m in res["by_k"].items()
        },
    }
    block["oracle_exact_accuracy"] = block["by_k"][K]["oracle_exact_accuracy"]
    out = {"trajectories": block}
    if K > 1:
        out["exact_accuracy"] = res["chosen"]["exact_accuracy"]
        out["token_accuracy"] = res["chosen"]["accuracy"]
    return out


def evaluate_trm(task, state, data: str, options: TRMEvalOptions = TRMEvalOptions(), *,
                 trained_on=None, batch=None, save_dir=None, progress=False) -> dict:  # fmt: skip
    """The evaluation report of a TRM state on `data`'s test split (see the module docstring),
    as `options` ask (test-time scaling: K noisy trajectories per puzzle)."""
    options.check(task.model_cfg.arch)
    task.check_eval_data(data, trained_on)
    if batch is not None:
        if batch <= 0:
            raise ConfigError(f"--batch {batch}: expected a positive number of puzzles")
        check_batch_divisible(task.mesh, task.cfg.mesh.rules, {"--batch": batch})
    is_arc = os.path.isfile(os.path.join(data, "test_puzzles.json"))
    evaluator = ARCEvaluator(data) if is_arc else None  # one checkpoint alone: fresh votes
    res = task.run_eval(
        state, data_dir=data, batch_size=batch, options=options, evaluator=evaluator,
        progress=progress,
    )  # fmt: skip
    m = res["metrics"]
    n = task.model_cfg.halt_max_steps
    out = {
        "exact_accuracy": m["exact_accuracy"],
        "token_accuracy": m["accuracy"],
        "count": int(res["count"]),
        "lm_loss": m["lm_loss"],
        "q_halt_accuracy": m["q_halt_accuracy"],
        "q_halt_loss": m["q_halt_loss"],
        "mean_steps": m["steps"],
        "halt_max_steps": n,
        "steps_run": n + options.extra_steps,
        "extra_steps": options.extra_steps,
        "halt": options.halt,
        "per_step": {
            "exact_accuracy": res["per_step"]["exact_accuracy"],
            "token_accuracy": res["per_step"]["accuracy"],
        },
        # the trainer's own metric names (metrics.jsonl), for a side-by-side check
        "metrics": {f"eval/all/{k}": v for k, v in m.items()},
    }
    if options.scaling is not None:
        out.update(_scaling_report(task, res, options.scaling))
    if evaluator is not None:
        arc = evaluator.result(save_dir) or {}
        for k, v in arc.items():  # "ARC/pass@K" (upstream's name) and plain "pass@K"
            out[k] = float(v)
            out[k.split("/")[-1]] = float(v)
    if options.show:
        out["show"] = show_boards(task, state, data, options.show, options.extra_steps, batch)
    return out


def show_boards(task, state, data: str, n: int, extra_steps: int = 0, batch: int | None = None):
    """-> (boards, note) of `n` test puzzles with the prediction after every ACT step, chosen by
    show.shown: first the puzzles the recursion fixes (wrong after ACT step 1, right after the
    last), then the first others. The test split is traced in evaluation batches until `n` fixed
    puzzles are found (the whole split when there are fewer)."""
    size = max(n, batch or task.data_cfg.eval_batch_size or task.batch)
    ds = PuzzleTestDataset(data, global_batch_size=size, process_index=0, process_count=1)
    fn = jax.jit(functools.partial(eval_step, task.graphdef, extra_steps=extra_steps, trace=True))
    m = task.model_cfg
    fixed, others, count = [], [], 0  # every fixed puzzle so far, the first n others
    for i in range(len(ds)):
        rows = ds[i]
        batch_rows = {key: rows[key] for key in ("inputs", "labels", "puzzle_identifiers")}
        with jax.set_mesh(task.mesh):
            out = jax.device_get(fn(state["train"], batch_rows))
        real = np.flatnonzero(rows["mask"])
        boards = puzzle_boards(
            rows["inputs"][real], rows["labels"][real], out["step_preds"][:, real],
            out["step_halts"][:, real], m.seq_len, m.vocab_size, real + i * size,
        )  # fmt: skip
        count += len(boards)
        fixed += [b for b in boards if b.fixed_by_recursion()]
        others += [b for b in boards if not b.fixed_by_recursion()][: n - len(others)]
        if len(fixed) >= n:
            break
    return shown(fixed + others, n, count)
