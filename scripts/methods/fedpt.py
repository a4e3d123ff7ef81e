"""--algorithm=fedpt: not implemented yet (see its issue)."""

from scripts import flag_groups
from tff_partial.training import method

FLAG_NAMES = ()


def validate_flags() -> None:
  raise flag_groups.FlagError('--algorithm=fedpt is not implemented yet; valid values: fedavg')


def build(ctx: method.MethodContext) -> method.BuiltMethod:
  raise NotImplementedError('fedpt')
