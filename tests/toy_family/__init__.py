"""A third model family, kept entirely in tests/ (docs/architecture.md, "Adding a model family"):
a toy MLP classifier on random data, registered by its module path (`task: tests.toy_family`),
so train/ holds no line of it. model.py is what models/<family>/ would hold, task.py what
train/families/<family>/ would, configs/ its config group (found through hydra.searchpath).
tests/test_toy_family.py trains it through `python -m train.main`, resumes it and evaluates it
with `python -m train.evaluate`.
"""

from tests.toy_family.task import ToyTask
from train.task import Family

FAMILY = Family(task=ToyTask)
