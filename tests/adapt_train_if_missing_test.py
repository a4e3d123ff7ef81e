"""`scripts.adapt --train_if_missing` trains through scripts.train's one path.

With DP-FTRL that path brings the epoch sampler: each client at most once per
epoch (as the reported epsilon assumes). Synthetic EMNIST has 2 clients; with 1
client per round an epoch is 2 rounds. Under `--seed=0` the loop's uniform
sampling would pick `synthetic1` in all 4 rounds, so this test fails if
adapt trains without the aggregator's `client_indices_fn`.
"""

# bazel: size=large
import json
import os
import shutil
import tempfile
from unittest import mock

from absl import flags
from absl.testing import flagsaver
import tensorflow as tf

from scripts import adapt
from tff_partial.training import loop


class TrainIfMissingTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

  def test_dp_ftrl_samples_each_client_once_per_epoch(self):
    trained = []  # (round, client id) of every client dataset a round builds
    real_selection_fn = loop.build_client_selection_fn

    def recording_selection_fn(task, *args, **kwargs):
      select = real_selection_fn(task, *args, **kwargs)
      data = task.train_data
      real_create = data.create_tf_dataset_for_client

      def recording_select(round_num):
        def create(client_id):
          trained.append((round_num, client_id))
          return real_create(client_id)
        with mock.patch.object(data, 'create_tf_dataset_for_client', create):
          return select(round_num)

      return recording_select

    run_dir = os.path.join(self.dir, 'run')
    with mock.patch.object(loop, 'build_client_selection_fn', recording_selection_fn):
      with flagsaver.flagsaver(
          run_dir=run_dir, results_dir=os.path.join(self.dir, 'out'),
          train_if_missing=True, task='emnist_2nn', data_source='synthetic',
          aggregator='dp_ftrl', noise_multiplier=0.5, clip_norm=0.1,
          total_rounds=4, clients_per_round=1, rounds_per_checkpoint=4,
          client_batch_size=5, client_max_batches=1, seed=0, num_participants=1,
          local_epochs=1, adapt_epochs=1, strategies=['finetune']):
        adapt.main(['adapt'])
    self.assertEqual([r for r, _ in trained], [1, 2, 3, 4])
    for epoch in ((1, 2), (3, 4)):
      clients = [c for r, c in trained if r in epoch]
      self.assertCountEqual(clients, ['synthetic1', 'synthetic2'])
    with open(os.path.join(run_dir, 'flags.json')) as f:
      saved = json.load(f)
    self.assertEqual((saved['aggregator'], saved['seed']), ('dp_ftrl', 0))
    self.assertTrue(os.path.exists(os.path.join(run_dir, 'model_weights.npz')))


if __name__ == '__main__':
  tf.test.main()
