"""Tests of tff_partial/select/keys.py: the key-choice ablations (paper Figs. 4, 6)."""

import numpy as np
import tensorflow as tf

from tff_partial.select import keys as keys_lib
from tff_partial.select import slicing
from tests.select_test_utils import bag_of_words, mlp, word_model


def _unit_spec(m=2):
  model = mlp()  # random keys over the 4 hidden units of dense2
  return slicing.make_select_spec(model, slicing.group_configs(model, ['dense2'], m, 'random'))


def _draws(policy, rounds, clients, dataset=None):
  return {(r, c): tuple(policy.client_keys(r, c, dataset)['dense2'])
          for r in rounds for c in clients}


class KeyAblationTest(tf.test.TestCase):

  def test_fresh_same_per_round_and_fixed_per_client(self):
    spec = _unit_spec()  # 2 of 4 units: 6 possible key sets
    rounds, clients = range(1, 7), ('a', 'b', 'c')
    fresh = _draws(keys_lib.KeyPolicy(spec, 'random', seed=3), rounds, clients)
    # Default: every client draws anew every round.
    self.assertGreater(len({fresh[(r, 'a')] for r in rounds}), 1)
    self.assertGreater(len({fresh[(1, c)] for c in clients}), 1)
    # Fig. 6 "same keys per round": one draw per round, shared by its clients.
    shared = _draws(keys_lib.KeyPolicy(spec, 'random', seed=3, same_keys_per_round=True),
                    rounds, clients)
    for r in rounds:
      self.assertLen({shared[(r, c)] for c in clients}, 1)
    self.assertGreater(len({shared[(r, 'a')] for r in rounds}), 1)
    # Fixed per client: one draw per client, kept in every round.
    fixed = _draws(keys_lib.KeyPolicy(spec, 'random', seed=3, fixed_client_keys=True),
                   rounds, clients)
    for c in clients:
      self.assertLen({fixed[(r, c)] for r in rounds}, 1)
    self.assertGreater(len({fixed[(1, c)] for c in clients}), 1)
    # Stateless: a new policy object (a resumed run) draws the same keys.
    again = keys_lib.KeyPolicy(spec, 'random', seed=3, fixed_client_keys=True)
    self.assertEqual(tuple(again.client_keys(9, 'b')['dense2']), fixed[(1, 'b')])
    with self.assertRaisesRegex(ValueError, 'exclude each other'):
      keys_lib.KeyPolicy(spec, 'random', same_keys_per_round=True, fixed_client_keys=True)

  def test_random_local_draws_from_the_clients_own_features(self):
    model = bag_of_words(n=12, tags=5)
    spec = slicing.make_select_spec(model, slicing.group_configs(model, ['dense'], 3, 'top'))
    x = np.zeros([2, 12], np.float32)
    x[:, [1, 4, 6, 9]] = [[1, 2, 0, 1], [0, 1, 3, 0]]  # the client's words: 1, 4, 6, 9
    dataset = tf.data.Dataset.from_tensors((x, np.zeros([2, 5], np.float32)))
    policy = keys_lib.KeyPolicy(spec, 'random_local', seed=0)
    draws = {tuple(policy.client_keys(r, 'a', dataset)['dense']) for r in range(20)}
    for keys in draws:
      self.assertLen(keys, 3)
      self.assertContainsSubset(keys, [1, 4, 6, 9])
    self.assertGreater(len(draws), 1)  # new keys each round...
    fixed = keys_lib.KeyPolicy(spec, 'random_local', seed=0, fixed_client_keys=True)
    self.assertLen({tuple(fixed.client_keys(r, 'a', dataset)['dense']) for r in range(5)}, 1)
    # A client with fewer words than m keeps them all and fills up as top
    # does (most frequent of the rest, then the lower key).
    five = slicing.make_select_spec(model, slicing.group_configs(model, ['dense'], 6, 'top'))
    keys = keys_lib.KeyPolicy(five, 'random_local').client_keys(0, 'a', dataset)['dense']
    self.assertAllEqual(keys, [0, 1, 2, 4, 6, 9])
    with self.assertRaisesRegex(ValueError, 'random_local.*structured layers only'):
      keys_lib.KeyPolicy(_unit_spec(), 'random_local')

  def test_random_local_keeps_padding_and_oov(self):
    model = word_model(vocab=10)
    spec = slicing.make_select_spec(model, slicing.group_configs(
        model, ['embedding', 'output'], 4, 'top', oov_index=9))
    tokens = np.array([[3, 3, 5, 5, 7]], np.int32)
    dataset = tf.data.Dataset.from_tensors((tokens, tokens))
    for r in range(5):
      keys = keys_lib.KeyPolicy(spec, 'random_local', seed=1).client_keys(r, 'a', dataset)
      self.assertContainsSubset([0, 9], keys['embedding'].tolist())
      self.assertContainsSubset(keys['embedding'].tolist(), [0, 3, 5, 7, 9])


if __name__ == '__main__':
  tf.test.main()
