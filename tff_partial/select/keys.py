"""How clients choose their select keys (federated select, sec. 4.1, 5.2-5.4).

Charles et al., *Federated Select* (2022):
* `top`: the m most frequent features / tokens (by key: bucket sums) in the
  client's data (structured keys, sec. 4.1.1, "Top");
* `random_top`: m keys drawn without replacement from the client's 2m most
  frequent (sec. 5.2, "Random Top");
* `random`: m keys uniformly without replacement from all K keys, independently
  per client, or one set for every client of a round (sec. 4.1.2 and the
  "independent key selection" ablation of sec. 5.3, Fig. 6:
  `same_keys_per_round`);
* `random_local`: m keys uniformly without replacement from the keys the
  client's own data contains (sec. 5.2, Fig. 4's "Random": "clients randomly
  choose m select keys from the set of words in their own vocabulary"); a
  client with fewer than m fills up as `top` does;
* `mixed`: structured keys (`top`) on the input/output layers, random keys on
  an inner layer (sec. 4.1.3, 5.4).

`fixed_client_keys`: a client draws its random keys (`random`, `random_top`,
`random_local`, the random part of `mixed`) once and keeps them every round,
like `top` keys, which never change ("in contrast to selecting the m most
frequent, these other two methods allow clients to use different keys at
different rounds of training", sec. 5.2). This is not Fig. 6's "same keys per
round", which shares one draw among all clients of a round.

Randomness is stateless: keys derive from (seed, round, client id, group), so a
resumed run draws the keys an uninterrupted run would. Keys are chosen on the
client from its own data; in simulation this runs in Python per sampled client
(`KeyPolicy.client_keys`), and the keys reach the TFF process with the data.
Every client sends exactly m keys (TFF's `federated_select` needs a fixed
number): a client with fewer than m distinct features fills up with the most
frequent of the rest (ties broken by the lower key).
"""

import collections
import zlib
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_partial.select import slicing

POLICIES = ('top', 'random_top', 'random', 'random_local', 'mixed')
# Marks the once-per-client stream of `fixed_client_keys` (no round in it).
_FIXED_STREAM = 2


def _rng(seed: int, round_num: Optional[int], client: Optional[str], group: int):
  """Keys' RNG for (seed, round, client, group); round None: the same every round."""
  client_hash = 0 if client is None else zlib.crc32(client.encode('utf-8'))
  if round_num is None:
    return np.random.default_rng([seed & 0xFFFFFFFF, 0, client_hash, group,
                                  _FIXED_STREAM])
  # SeedSequence of the tuple: stateless and independent per component.
  return np.random.default_rng([seed & 0xFFFFFFFF, round_num, client_hash,
                                group, 0 if client is None else 1])


def count_indices(group: slicing.SelectGroup, dataset) -> np.ndarray:
  """Per-index frequencies of the group's features/tokens in `dataset`."""
  counts = np.zeros([group.num_indices], np.float64)
  for batch in dataset.as_numpy_iterator() if hasattr(dataset, 'as_numpy_iterator') else dataset:
    x, y = slicing._xy(batch)  # pylint: disable=protected-access
    if group.input_role == 'tokens':
      counts += np.bincount(np.asarray(x).reshape(-1).astype(np.int64),
                            minlength=group.num_indices)[:group.num_indices]
    elif group.input_role == 'features':
      x = np.asarray(x)
      counts += x.reshape(-1, x.shape[-1]).sum(axis=0)
    if group.output_role == 'classes':
      y = np.asarray(y)
      if np.issubdtype(y.dtype, np.floating):
        counts += y.reshape(-1, y.shape[-1]).sum(axis=0)
      else:
        counts += np.bincount(y.reshape(-1).astype(np.int64),
                              minlength=group.num_indices)[:group.num_indices]
  return counts


def required_keys(group: slicing.SelectGroup) -> list:
  """Keys every client of a token group selects, whatever its policy.

  The padding token of an embedding with `mask_zero` (Keras masks local id 0,
  so it must stay the client's local 0) and the OOV token (words a client did
  not select map to it).
  """
  keys = []
  if group.pad_index is not None:
    keys.append(group.pad_index // group.bucket_size)
  if group.oov_index is not None:
    oov_key = group.oov_index // group.bucket_size
    if oov_key not in keys:
      keys.append(oov_key)
  return keys


def with_required(group: slicing.SelectGroup, keys, m: int) -> np.ndarray:
  """`keys` (in order of preference) with the required keys put in, m in all."""
  required = required_keys(group)
  if len(required) > m:
    raise ValueError(f'--select_keys={m} for {group.name}: needs at least '
                     f'{len(required)} (padding and OOV tokens)')
  rest = [k for k in np.asarray(keys).tolist() if k not in required]
  return np.asarray(required + rest[:m - len(required)], np.int64)


def top_keys(group: slicing.SelectGroup, counts: np.ndarray, m: int) -> np.ndarray:
  """The m keys (buckets) of largest summed count; ties -> lower key."""
  per_key = counts.reshape(group.num_keys, group.bucket_size).sum(axis=1)
  order = np.argsort(-per_key, kind='stable')
  return with_required(group, order, m)


class KeyPolicy:
  """Chooses every group's keys for one client of one round.

  `client_keys(round_num, client_id, dataset)` returns an OrderedDict
  group name -> int32[m] (sorted ascending).
  """

  def __init__(self, spec: slicing.SelectSpec, policy: str, seed: int = 0,
               same_keys_per_round: bool = False, fixed_client_keys: bool = False):
    if policy not in POLICIES:
      raise ValueError(f'--select_policy={policy!r}; valid values: '
                       + ', '.join(POLICIES))
    if same_keys_per_round and fixed_client_keys:
      raise ValueError('--select_same_keys_per_round (one draw per round for all '
                       'clients) and --select_fixed_client_keys (one draw per '
                       'client for all rounds) exclude each other')
    if policy == 'random_local' and not all(g.structured for g in spec.groups):
      raise ValueError('--select_policy=random_local draws from the keys in a '
                       "client's data: structured layers only")
    self.spec = spec
    self.policy = policy
    self.seed = seed
    self.same_keys_per_round = same_keys_per_round
    self.fixed_client_keys = fixed_client_keys
    self._top_cache = {}

  def _group_policy(self, group) -> str:
    if self.policy == 'mixed':
      return 'top' if group.structured else 'random'
    return self.policy

  def needs_data(self) -> bool:
    return any(self._group_policy(g) in ('top', 'random_top', 'random_local')
               for g in self.spec.groups)

  def client_keys(self, round_num: int, client_id: Optional[str], dataset=None):
    out = collections.OrderedDict()
    # The round the random draws are keyed by (None: the same every round).
    draw_round = None if self.fixed_client_keys else round_num
    for i, group in enumerate(self.spec.groups):
      m = group.keys_per_client
      policy = self._group_policy(group)
      if policy == 'random':
        who = None if self.same_keys_per_round else str(client_id)
        keys = _rng(self.seed, draw_round, who, i).choice(
            group.num_keys, size=m, replace=False)
        if required_keys(group):
          keys = with_required(group, keys, m)
      else:
        if dataset is None:
          raise ValueError(f'--select_policy={policy} needs the client data')
        cache_key = (client_id, i)
        if policy == 'top' and cache_key in self._top_cache:
          keys = self._top_cache[cache_key]
        else:
          counts = count_indices(group, dataset)
          rng = _rng(self.seed, draw_round, str(client_id), i)
          if policy == 'top':
            keys = top_keys(group, counts, m)
            if client_id is not None:
              self._top_cache[cache_key] = keys
          elif policy == 'random_top':  # m of the 2m most frequent
            pool = top_keys(group, counts, min(2 * m, group.num_keys))
            keys = with_required(group, rng.choice(pool, size=m, replace=False), m)
          else:  # random_local: m of the keys in the client's data
            per_key = counts.reshape(group.num_keys, group.bucket_size).sum(axis=1)
            own = rng.permutation(np.flatnonzero(per_key > 0))
            seen = set(own.tolist())
            rest = [k for k in top_keys(group, counts, group.num_keys) if k not in seen]
            keys = with_required(group, np.concatenate([own, rest]).astype(np.int64), m)
      out[group.name] = np.sort(np.asarray(keys, np.int32))
    return out


def all_keys(spec: slicing.SelectSpec):
  """Every key of every group (m = K): federated select == broadcast."""
  return collections.OrderedDict(
      (g.name, np.arange(g.num_keys, dtype=np.int32)) for g in spec.groups)


def as_tensor_keys(keys):
  return collections.OrderedDict((k, tf.constant(v, tf.int32)) for k, v in keys.items())
