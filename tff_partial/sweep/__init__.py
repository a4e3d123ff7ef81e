"""Seeded sweeps of training runs: grids, seeds, learning-rate search, summaries, plots.

`spec`: the sweep spec (JSON) and its configs; `plan`: the runs and their
directories; `manifest`: the sweep directory's record and lock; `runner`: the
subprocess scheduler; `lr_search`: choosing learning rates on a validation
split; `summary` and `plots`: results over seeds; `driver`: all of it.
The binary is `scripts/sweep.py`; docs/sweeps.md describes its use.
"""

from tff_partial.sweep.driver import bank
from tff_partial.sweep.driver import check_bank
from tff_partial.sweep.driver import CheckError
from tff_partial.sweep.driver import prepare
from tff_partial.sweep.driver import run
from tff_partial.sweep.driver import search_runs
from tff_partial.sweep.driver import summarize
from tff_partial.sweep.driver import TrainInterface
from tff_partial.sweep.manifest import SweepDirError
from tff_partial.sweep.runner import SweepInterrupted
from tff_partial.sweep.spec import from_dict
from tff_partial.sweep.spec import load_spec
from tff_partial.sweep.spec import merge_overrides
from tff_partial.sweep.spec import SpecError
from tff_partial.sweep.spec import SweepSpec
