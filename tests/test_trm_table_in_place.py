"""The puzzle table is updated in place: the compiled TRM train step holds no copy of it.

A table passed through the cond that skips steps past total_steps was copied whole, twice per
step (once into the branch's output, once out of the cond): on the real Sudoku data (1,001,001
rows x 512) that is 2 x 2 GB of copies each step. SignSGD now runs after the cond on its
gathered inputs (models/trm/training.py; docs/porting_trm_training.md, "The puzzle table stays
out of the cond"), and XLA scatters into the donated table. Proven on the optimised CPU HLO of
the trainer's own jitted step (trm_sudoku_tiny with a 4099-row table): no `copy` of the table's
shape, and one scatter writes the table. That skipped steps
still keep the table's bits is tests/test_trm_training_parity.py's."""

from __future__ import annotations

import re

from bench import configs, runners

ROWS = 4099  # a size no other array of the tiny model has


def test_the_compiled_step_scatters_into_the_table_without_copying_it():
    rc = configs.resolve(configs.get("trm_sudoku_tiny"))
    rc["trainer_cfg"]["data"]["num_puzzle_identifiers"] = ROWS
    rc["model"]["num_puzzle_identifiers"] = ROWS
    runner = runners.JaxRunner(rc, {"seed": 0, "device": "cpu"})
    runner.setup()
    hlo = runner.step_fn.lower(runner.state, runner.batch).compile().as_text()
    result = re.compile(rf"\s*(ROOT )?%\S+ = f32\[{ROWS},\d+\]")  # ops that produce a table
    lines = [line for line in hlo.splitlines() if result.match(line)]
    assert lines, "the table is not in the step"
    copies = [line.strip()[:160] for line in lines if re.search(r"\bcopy(-start)?\(", line)]
    assert not copies, copies
    scatters = [line for line in lines if "scatter" in line and "fusion(" in line]
    assert len(scatters) == 1, scatters
