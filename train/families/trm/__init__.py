"""TRM on the trainer: upstream pretrain.py's training of models/trm/ (docs/architecture.md,
"Adding a model family").

    task.py      TRMTask: config checks, state (train state + ACT carry), steps, evaluation loop,
                 weights in and out
    data.py      the `data` section, building a puzzle data set, the checks that it fits
    evaluate.py  its part of `python -m train.evaluate` (--extra-steps, --halt, --show, --plot,
                 Sudoku CSV, ARC pass@K)
    weights.py   upstream TRM checkpoints for train.source
    show.py      puzzles as boards (--show)
"""

from train.families.trm.evaluate import TRMEvaluation
from train.families.trm.task import TRMTask
from train.families.trm.weights import UpstreamTRMCheckpoint
from train.task import Family

FAMILY = Family(task=TRMTask, evaluation=TRMEvaluation(), weights_files=(UpstreamTRMCheckpoint(),))
