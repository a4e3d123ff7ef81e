"""Privacy accountant CLI: epsilon of a planned DP-FTRL or DP-FedAvg run.

  python -m scripts.privacy --mechanism=dp_ftrl --noise_multiplier=1.0 \
      --rounds=1600 --clients_per_round=100 --population=342477 --target_delta=1e-6

Prints a human-readable line, then a JSON object with an `epsilon` key as the
last line. Accounting is `tff_partial.privacy.accounting` (dp_accounting's RDP
accountant; see docs/privacy.md for the events and neighbouring relations).
"""

import json
import math

from absl import app
from absl import flags

from scripts import flag_groups
from scripts.methods import aggregators
from tff_partial.privacy import accounting

_MECHANISM = flags.DEFINE_enum(
    'mechanism', 'dp_ftrl', ('dp_ftrl', 'dp_gaussian'),
    'dp_ftrl: tree aggregation restarted every epoch; dp_gaussian: DP-FedAvg.')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'Training rounds (>= 0).')
_POPULATION = flags.DEFINE_integer('population', None, 'Number of training clients.')
# The DP flags and --clients_per_round are the training binary's own
# definitions (one definition per flag, so both binaries can share a process).
_NOISE = aggregators.NOISE_MULTIPLIER
_DELTA = aggregators.TARGET_DELTA
_SAMPLING = aggregators.DP_SAMPLING
_RESTART = aggregators.DP_FTRL_RESTART
_CPR = flag_groups.CLIENTS_PER_ROUND


def _given(name: str) -> bool:
  """The flag was set on the command line (or by a test's flagsaver)."""
  holder = flags.FLAGS[name]
  return bool(holder.present) or not holder.using_default_value


class UsageError(ValueError):
  """Bad flag; the message names it."""


def compute() -> dict:
  """Epsilon for the flags; raises UsageError naming a bad flag."""
  for holder in (_ROUNDS, _POPULATION):
    if holder.value is None:
      raise UsageError(f'--{holder.name} is required')
  if _NOISE.value is None or _NOISE.value < 0:
    raise UsageError(f'--noise_multiplier={_NOISE.value} must be >= 0')
  if _ROUNDS.value < 0:
    raise UsageError(f'--rounds={_ROUNDS.value} must be >= 0')
  if _POPULATION.value < 1:
    raise UsageError(f'--population={_POPULATION.value} must be >= 1')
  if _CPR.value is None or not 1 <= _CPR.value <= _POPULATION.value:
    raise UsageError(
        f'--clients_per_round={_CPR.value} must be in [1, --population={_POPULATION.value}]')
  delta = _DELTA.value if _DELTA.value is not None else 1.0 / _POPULATION.value
  if not 0.0 < delta < 1.0:
    raise UsageError(f'--target_delta={delta} must be in (0, 1)')
  mechanism = _MECHANISM.value
  if mechanism == 'dp_ftrl':
    if _given('dp_sampling'):
      raise UsageError('--dp_sampling applies only to --mechanism=dp_gaussian')
    try:
      eps = accounting.dp_ftrl_epsilon(_NOISE.value, _ROUNDS.value, _CPR.value,
                                       _POPULATION.value, delta, restart=_RESTART.value)
    except ValueError as e:
      raise UsageError(f'--rounds / --dp_ftrl_restart: {e}') from e
  else:
    if _given('dp_ftrl_restart'):
      raise UsageError('--dp_ftrl_restart applies only to --mechanism=dp_ftrl')
    eps = accounting.dp_fedavg_epsilon(_NOISE.value, _ROUNDS.value, _CPR.value,
                                       _POPULATION.value, delta, sampling=_SAMPLING.value)
  return {
      'mechanism': mechanism,
      'noise_multiplier': _NOISE.value,
      'rounds': _ROUNDS.value,
      'clients_per_round': _CPR.value,
      'population': _POPULATION.value,
      'target_delta': delta,
      'epsilon': eps if math.isfinite(eps) else None,
      'epsilon_is_infinite': not math.isfinite(eps),
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    report = compute()
  except UsageError as e:
    raise app.UsageError(str(e)) from e
  eps = report['epsilon']
  print(f"{report['mechanism']}: epsilon = {eps if eps is not None else 'inf'} at "
        f"delta = {report['target_delta']:g} after {report['rounds']} rounds")
  print(json.dumps(report))


if __name__ == '__main__':
  app.run(main)
