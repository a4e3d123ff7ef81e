"""DP noise is secret by default; `--dp_noise_seed` makes it public and says so.

Two runs with the same `--seed` must draw different DP noise (a `--seed` saved
in flags.json would otherwise let anyone subtract the noise) unless
`--dp_noise_seed` is given; then they repeat exactly, and every epsilon
printed (dry-run JSON, progress line, metrics.csv, final JSON) carries
`aggregators.PRIVACY_NOTE`.
"""

# bazel: size=large
import csv
import json
import os

from absl import flags
from absl.testing import flagsaver
import numpy as np
import tensorflow as tf

from scripts.methods import aggregators
from tests import composition_testing
from tests import testing_utils
from tff_partial.training import loop

_NOISY = dict(noise_multiplier=1.0, clip_norm=0.1)


class NoiseSeedTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    cls.task = composition_testing.tiny_task()

  def _server_update(self, aggregator, **extra):
    """A fresh build (a new run) and one round from the seeded initial model."""
    flag_values = dict(composition_testing.case_flags('fedavg', aggregator), **_NOISY, **extra)
    with flagsaver.flagsaver(**flag_values):
      from scripts import train  # pylint: disable=g-import-not-at-top
      train.validate_training_flags()
      built, choice = train.build(self.task)
    process = built.process
    weights = loop.initial_model_weights(self.task, 3)
    state = process.set_model_weights(process.initialize(), weights)
    values = loop.build_client_selection_fn(
        self.task, built, len(composition_testing.EXAMPLES), 3, choice.client_indices_fn)(1)
    after = process.get_model_weights(process.next(state, values).state)
    return np.concatenate([np.ravel(a - b) for a, b in zip(weights.trainable, after.trainable)])

  def test_noise_differs_between_runs_unless_the_seed_is_public(self):
    for aggregator in composition_testing.DP:
      with self.subTest(aggregator):
        first, second = self._server_update(aggregator), self._server_update(aggregator)
        # Noise std per coordinate: clip * z / 3 clients = 0.033.
        self.assertGreater(np.abs(first - second).max(), 0.01)
        seeded = [self._server_update(aggregator, dp_noise_seed=7) for _ in range(2)]
        self.assertAllEqual(seeded[0], seeded[1])
        self.assertGreater(np.abs(seeded[0] - first).max(), 0.01)

  def test_every_epsilon_says_the_seed_is_public(self):
    out = self.create_tempdir().full_path
    lines = []
    flag_values = dict(composition_testing.case_flags('fedavg', 'dp_gaussian'),
                       **_NOISY, dp_noise_seed=7, total_rounds=1)
    with flagsaver.flagsaver(**flag_values):
      from scripts import train  # pylint: disable=g-import-not-at-top
      built, choice = train.build(self.task)
      self.assertEqual(choice.privacy_note, aggregators.PRIVACY_NOTE)
      train.train_built(self.task, built, choice, out, run_flags={}, print_fn=lines.append)
    epsilon_lines = [line for line in lines if 'epsilon' in line]
    self.assertLen(epsilon_lines, 2)  # round 0 and round 1
    for line in epsilon_lines:
      self.assertIn(f'({aggregators.PRIVACY_NOTE})', line)
    with open(os.path.join(out, 'metrics.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertEqual([r['privacy/note'] for r in rows], [aggregators.PRIVACY_NOTE] * 2)
    # Without the seed: no note anywhere.
    with flagsaver.flagsaver(**dict(flag_values, dp_noise_seed=None)):
      self.assertIsNone(train.build(self.task)[1].privacy_note)

  def test_dry_run_json_has_the_privacy_note(self):
    common = dict(task='emnist_2nn', data_source='synthetic', clients_per_round=1,
                  total_rounds=2, aggregator='dp_ftrl', dry_run=True, **_NOISY)
    code, stdout, _ = testing_utils.run_train_main(dp_noise_seed=3, **common)
    self.assertEqual(code, 0)
    report = json.loads(stdout.strip().splitlines()[-1])
    self.assertEqual(report['privacy_note'], aggregators.PRIVACY_NOTE)
    self.assertGreater(report['epsilon'], 0)
    code, stdout, _ = testing_utils.run_train_main(**common)
    self.assertNotIn('privacy_note', json.loads(stdout.strip().splitlines()[-1]))
    # The seed cannot be used where the noise takes none.
    code, _, stderr = testing_utils.run_train_main(
        **dict(common, aggregator='dp_gaussian', dp_adaptive_clip=True, dp_noise_seed=3))
    self.assertEqual(code, 2)
    self.assertIn('--dp_noise_seed', stderr)
    mean = {k: v for k, v in common.items() if k not in _NOISY}
    code, _, stderr = testing_utils.run_train_main(
        **dict(mean, aggregator='mean', dp_noise_seed=3))
    self.assertEqual(code, 2)
    self.assertIn('--dp_noise_seed applies only to', stderr)


if __name__ == '__main__':
  tf.test.main()
