r"""Checks training argv lists with `scripts.train`'s own flag validation; builds nothing.

The sweep binary runs it once per sweep, before any run starts:

  echo '{"argvs": [["--task=emnist_cnn", "--algorithm=pvt", "--frozen_layers=dense1"]]}' \
      | python -m scripts.sweep_check

It prints one JSON object: `errors` (per argv, one line or null) and
`total_rounds_default`. It parses each argv into scripts.train's flags and
runs the checks scripts.train makes before it loads data: unknown flags and
bad values (absl), flags of another --algorithm or --aggregator, task flags
of another task, optimizer and client settings, and layer names and key
counts against the task's model (`train.check_model_flags`).
"""

import json
import sys

from absl import flags

from scripts import flag_groups
from scripts import train
from tasks import registry


def check_argv(argv) -> 'str | None':
  """The error line scripts.train would give for `argv` before loading data, or None."""
  all_flags = flags.FLAGS
  all_flags.unparse_flags()
  try:
    all_flags(['scripts.train'] + list(argv))
    train._validate_common()  # pylint: disable=protected-access  (scripts.train's checks)
    train.check_model_flags()
    flag_groups.task_hparams(flag_groups.TASK.value)
    flag_groups.client_specs()
    flag_groups.client_optimizer()
    flag_groups.server_optimizer()
  except flags.UnrecognizedFlagError as e:
    return f'--{e.flagname} is not a flag of scripts.train'
  except (flags.Error, flag_groups.FlagError, registry.TaskError) as e:
    return str(e)
  finally:
    # Leave the flags parsed, at their defaults.
    all_flags.unparse_flags()
    all_flags(['scripts.train'])
  return None


def check(argvs) -> list:
  return [check_argv(argv) for argv in argvs]


def main() -> None:
  request = json.load(sys.stdin)
  print(json.dumps({
      'errors': check(request['argvs']),
      'total_rounds_default': flag_groups.TOTAL_ROUNDS.default,
  }))


if __name__ == '__main__':
  main()
