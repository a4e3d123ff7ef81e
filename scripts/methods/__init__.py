"""Flag groups and builders of the training methods, one module per method.

Every module here defines, at import:
  FLAG_NAMES: the absl flags that belong to it alone (rejected for other methods);
  validate_flags(): raises `flag_groups.FlagError` naming the flag and valid values;
  build(ctx: tff_partial.training.method.MethodContext) -> BuiltMethod;
and, if its flags name layers, check_model(keras_model_fn): raises
`FlagError` for names or sizes the task's model lacks, before the data loads
(`scripts.train.check_model_flags`).
`aggregators` is the same for `--aggregator` (see its docstring).
"""

import importlib

ALGORITHMS = ('fedavg', 'fedpt', 'pvt', 'select')


def method_module(name: str):
  """The flags+builder module of algorithm `name`."""
  return importlib.import_module(f'scripts.methods.{name}')


def all_method_modules():
  return {name: method_module(name) for name in ALGORITHMS}
