"""Which variables a PVT client trains: the fixed / PR / PCPR mask schemes.

Yang et al., *Partial Variable Training for Efficient On-Device Federated
Learning* (PVT), section 2.2. Non-freezable variables (by default the additive
vectors) are always trained; of the freezable ones (multiplicative vectors and
matrices) a fraction `freeze_fraction` is frozen, chosen at random:

* `fixed`: one choice for all clients of all rounds;
* `per_round` (PR): a new choice each round, shared by that round's clients;
* `per_client_per_round` (PCPR): a new choice for every client of every round;
* `biases_only`: the paper's extreme point (section 3.3, Table 4: "only
  training biases (i.e., freezing all freezable variables)", 593x less
  upload): every client trains exactly the non-freezable variables (the
  additive vectors: biases and normalization offsets) and freezes every
  matrix and multiplicative vector, in every round. `freeze_fraction` does not
  apply (it is 1 by definition); the mask is fixed, like `fixed`'s.

`freeze_fraction` counts variables (as the paper does: "freeze 90% of
freezable variables"), rounded down, so that at least the asked fraction of
freezable variables stays trained. With `freeze_matrices_first` the frozen ones
are drawn from the multiplicative matrices first and from the other freezable
variables only once every matrix is frozen (the paper's "freeze multiplicative
matrices first"); otherwise uniformly among all freezable variables.

Randomness is stateless: the mask of (round, client) is a pure function of
(seed, round, client index in the round's sample), drawn from a NumPy
`SeedSequence` keyed by those numbers, so runs are reproducible and a resumed
run draws the same masks as an uninterrupted one. A mask is a float32 vector
with one entry per trainable variable (1 = trained, 0 = frozen), in the order
of `tff.learning.models.ModelWeights.trainable`.
"""

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from tff_partial.masks import variable_types as vt

SCHEMES = ('fixed', 'per_round', 'per_client_per_round', 'biases_only')
# Schemes whose mask is the same for every client and round (known at build time).
STATIC_SCHEMES = ('fixed', 'biases_only')
# Mixed into every seed so that PVT masks never coincide with another seeded
# choice of the package (client sampling, frozen weights) under the same seed.
_PVT_STREAM = 0x50565420  # b'PVT '


@dataclasses.dataclass(frozen=True)
class MaskSampler:
  """Samples PVT masks statelessly from (seed, round, client).

  Attributes:
    types: the `VariableType` of every trainable variable, in TFF order.
    scheme: one of `SCHEMES`.
    freeze_fraction: fraction of the freezable variables frozen, in [0, 1)
      (ignored by `biases_only`, which freezes them all).
    seed: the run's seed.
    freeze_matrices_first: freeze multiplicative matrices before vectors.
    freezable_types: types that may be frozen (default: multiplicative
      vectors and matrices; additive vectors are always trained).
  """

  types: tuple
  scheme: str = 'per_client_per_round'
  freeze_fraction: float = 0.9
  seed: int = 0
  freeze_matrices_first: bool = False
  freezable_types: tuple = vt.DEFAULT_FREEZABLE

  def __post_init__(self):
    object.__setattr__(self, 'types', tuple(vt.VariableType(t) for t in self.types))
    object.__setattr__(
        self, 'freezable_types', tuple(vt.VariableType(t) for t in self.freezable_types))
    if self.scheme not in SCHEMES:
      raise ValueError(
          f'scheme={self.scheme!r} (--pvt_scheme); valid values: {", ".join(SCHEMES)}')
    if self.scheme != 'biases_only' and not 0.0 <= float(self.freeze_fraction) < 1.0:
      raise ValueError(
          f'freeze_fraction={self.freeze_fraction} (--pvt_freeze_fraction) must be '
          'in [0, 1): a fraction of the freezable variables to freeze (to '
          'freeze them all, use --pvt_scheme=biases_only)')
    if not self.types:
      raise ValueError('types is empty: the model has no trainable variables')
    if self.scheme == 'biases_only' and len(self.freezable) == len(self.types):
      raise ValueError(
          '--pvt_scheme=biases_only: the model has no non-freezable (additive) '
          'variable to train')

  @property
  def is_static(self) -> bool:
    """Whether every client of every round has the same mask."""
    return self.scheme in STATIC_SCHEMES

  @property
  def num_variables(self) -> int:
    return len(self.types)

  @property
  def freezable(self) -> list[int]:
    return vt.freezable_indices(self.types, self.freezable_types)

  @property
  def num_frozen(self) -> int:
    """Frozen variables per client: floor(fraction * #freezable) (all: biases_only)."""
    if self.scheme == 'biases_only':
      return len(self.freezable)
    return int(math.floor(self.freeze_fraction * len(self.freezable) + 1e-9))

  def _pools(self) -> tuple[list[int], list[int]]:
    """(first pool, second pool) of freezable indices, in freezing order."""
    freezable = self.freezable
    if not self.freeze_matrices_first:
      return freezable, []
    matrices = [i for i in freezable if self.types[i] == vt.MULTIPLICATIVE_MATRIX]
    others = [i for i in freezable if self.types[i] != vt.MULTIPLICATIVE_MATRIX]
    return matrices, others

  def _key(self, round_num: int, client_index: int) -> list[int]:
    seed = int(self.seed) % (2**32)
    if self.scheme == 'fixed':
      return [seed, _PVT_STREAM]
    if self.scheme == 'per_round':
      return [seed, _PVT_STREAM, int(round_num)]
    return [seed, _PVT_STREAM, int(round_num), int(client_index)]

  def mask(self, round_num: int, client_index: int = 0) -> np.ndarray:
    """float32[num_variables]: 1 for trained, 0 for frozen variables."""
    if round_num < 0 or client_index < 0:
      raise ValueError(f'round_num={round_num} and client_index={client_index} must be >= 0')
    if self.scheme == 'biases_only':
      mask = np.ones([self.num_variables], np.float32)
      mask[self.freezable] = 0.0
      return mask
    rng = np.random.default_rng(np.random.SeedSequence(self._key(round_num, client_index)))
    mask = np.ones([self.num_variables], np.float32)
    remaining = self.num_frozen
    for pool in self._pools():
      take = min(remaining, len(pool))
      if take:
        mask[rng.choice(np.asarray(pool), size=take, replace=False)] = 0.0
      remaining -= take
    return mask

  def trained_probability(self) -> np.ndarray:
    """float64[num_variables]: probability that a client trains each variable.

    Exact for `per_round` / `per_client_per_round` (every variable of a pool
    is equally likely to be drawn); for `fixed` it is the fixed mask itself.
    """
    if self.is_static:
      return self.mask(0, 0).astype(np.float64)
    prob = np.ones([self.num_variables], np.float64)
    remaining = self.num_frozen
    for pool in self._pools():
      take = min(remaining, len(pool))
      if pool:
        prob[pool] = 1.0 - take / len(pool)
      remaining -= take
    return prob


def trained_bytes(
    sampler: MaskSampler,
    variable_bytes: Sequence[int],
    mask: Optional[np.ndarray] = None,
) -> float:
  """Bytes of the trained variables: of `mask`, or expected over the scheme."""
  variable_bytes = np.asarray(variable_bytes, np.float64)
  if len(variable_bytes) != sampler.num_variables:
    raise ValueError(
        f'{len(variable_bytes)} variable sizes for {sampler.num_variables} variables')
  weights = sampler.trained_probability() if mask is None else np.asarray(mask)
  return float(np.sum(weights * variable_bytes))
