"""FedPT: federated learning of partially trainable networks (Sidahmed et al.).

Frozen variables are regenerated on every client from one seed
(`regeneration`), chosen by name / regex / trainable fraction (`selection`),
and trained around by `build_fedpt_process` (`process`).
"""

from tff_partial.frozen.process import build_fedpt_process
from tff_partial.frozen.process import FreezePlan
from tff_partial.frozen.process import plan_freezing
from tff_partial.frozen.regeneration import FROZEN_INITIALIZERS
from tff_partial.frozen.regeneration import FrozenVariable
from tff_partial.frozen.regeneration import regenerate
from tff_partial.frozen.regeneration import seed_tensor
from tff_partial.frozen.regeneration import SUPPORTED_INITIALIZERS
from tff_partial.frozen.selection import INPUT_FIRST
from tff_partial.frozen.selection import LARGEST_FIRST
from tff_partial.frozen.selection import ORDERS
from tff_partial.frozen.selection import select_frozen_layers
from tff_partial.frozen.selection import trainable_fraction
