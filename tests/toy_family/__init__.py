"""A third model family, kept entirely in tests/ (docs/architecture.md, "Adding a model family"):
a toy MLP classifier on random data. model.py is what models/<family>/ would hold, task.py and
commands.py what train/families/<family>/ would, configs/ its config group (found through
hydra.searchpath). It has no original code base: no weights files, no import, no export.

It is registered the way a family in a package of its own is: an entry point of the group
`trm_jax_port.families` in the metadata of an installed distribution (registered/, a
`.dist-info` folder that tests/conftest.py puts on the path of every test process, so the whole
test suite runs with a third family registered). `family: tests.toy_family` (its module path) works
without it. tests/test_toy_family.py trains it through `python -m train.main`, resumes, evaluates
and samples it.
"""

from tests.toy_family.commands import ToyEvaluation, ToySampler
from tests.toy_family.task import ToyTask
from train.task import Family

FAMILY = Family(task=ToyTask, evaluation=ToyEvaluation(), sampler=ToySampler())
