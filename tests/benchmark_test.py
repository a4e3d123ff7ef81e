"""Smoke test of scripts.benchmark main(): synthetic data, 2 clients, 2 rounds.

No timed assertions: what is checked is that every configuration and
reference ran the same rounds on the same examples, and the exact numbers
(parameters, bytes, steps, examples, memory ordering).
"""

import json
import os
import shutil
import tempfile

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver

from scripts import benchmark

FLAGS = flags.FLAGS


class BenchmarkTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    if not FLAGS.is_parsed():
      FLAGS(['benchmark_test'])
    self.output_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.output_dir, ignore_errors=True)

  def test_fedavg_configs_side_by_side(self):
    with flagsaver.flagsaver(
        task='emnist_cnn', data_source='synthetic', clients_per_round=2,
        benchmark_rounds=2, benchmark_warmup_rounds=1, benchmark_empty_rounds=1,
        benchmark_configs=['tff_fedavg', 'fedavg', 'fedpt_dense1'], client_max_batches=2,
        benchmark_config=['pvt_half:pvt:pvt_freeze_fraction=0.5'],
        benchmark_memory=True, benchmark_memory_clients=2, output_dir=self.output_dir):
      benchmark.main(['benchmark'])
    with open(os.path.join(self.output_dir, 'benchmark.json')) as f:
      report = json.load(f)
    with open(os.path.join(self.output_dir, 'benchmark.md')) as f:
      table = f.read()
    rows = {r['name']: r for r in report['rows']}
    self.assertEqual(list(rows), ['tff_fedavg', 'fedavg', 'fedpt_dense1', 'pvt_half'])
    for name in ('tff_fedavg', 'fedavg'):
      row = rows[name]
      self.assertEqual(row['rounds_timed'], 1)
      self.assertGreater(row['median_round_seconds'], 0.0)
      self.assertGreater(row['examples_per_round'], 0)
      self.assertBetween(row['accuracy'], 0.0, 1.0)
      # emnist_cnn: 1,690,046 float32 parameters, all sent down and up.
      self.assertEqual(row['params_total'], 1690046)
      self.assertEqual(row['bytes_down_per_client'], 4 * 1690046)
      self.assertEqual(row['bytes_up_per_client'], 4 * 1690046)
      self.assertIn(f'| {name} |', table)
    self.assertAlmostEqual(rows['tff_fedavg']['round_time_vs_tff_fedavg'], 1.0)
    self.assertEqual(rows['fedavg']['bytes_vs_tff_fedavg'], 1.0)
    # The centralized references ran on the same examples: TFF's synthetic
    # EMNIST has 2 clients of 10 examples (one batch each), one timed round;
    # the floor took exactly the clients' 2 gradient steps.
    refs = {r['name']: r for r in report['references']}
    self.assertEqual(list(refs), ['keras_in_memory', 'keras_tff_data_path',
                                  'tf_function_floor'])
    for ref in refs.values():
      self.assertEqual(ref['rounds_timed'], 1)
      self.assertEqual(ref['examples_per_round'], rows['fedavg']['examples_per_round'])
      self.assertIn(f"| {ref['name']} |", table)
    self.assertEqual(rows['fedavg']['examples_per_round'], 2 * 10)
    self.assertEqual(refs['tf_function_floor']['gradient_steps_per_round'], 2)
    self.assertAlmostEqual(refs['keras_in_memory']['throughput_vs_limit'], 1.0)
    self.assertAlmostEqual(
        rows['fedavg']['throughput_vs_limit'],
        rows['fedavg']['examples_per_second'] / refs['keras_in_memory']['examples_per_second'])
    self.assertIn('AVX-512', report['machine'])
    self.assertIn('oneDNN', report['machine'])
    self.assertIn('--client_loop=auto -> ', report['client_loop'])
    self.assertNotIn('skipped', rows['pvt_half'])
    # Client extra training memory (tff_partial.measure.memory): TFF's and this
    # package's FedAvg train the same variables, so they share one measurement;
    # freezing dense1 saves its kernel's gradient (measured on TF's Eigen
    # path: 42.4 MB all-variable vs 36.0 MB; the convolutions' gradients need
    # Eigen's im2col buffers, about 32 MB, either way).
    all_vars = rows['fedavg']['client_extra_memory_bytes']
    self.assertGreater(all_vars, 4 * 1690046)  # at least every gradient
    self.assertEqual(rows['tff_fedavg']['client_extra_memory_bytes'], all_vars)
    dense1_kernel = 4 * 3136 * 512
    self.assertGreater(all_vars - rows['fedpt_dense1']['client_extra_memory_bytes'],
                       0.9 * dense1_kernel)
    self.assertEqual(rows['fedpt_dense1']['client_extra_memory_bytes_max'],
                     rows['fedpt_dense1']['client_extra_memory_bytes'])
    self.assertLessEqual(rows['pvt_half']['client_extra_memory_bytes'],
                         rows['pvt_half']['client_extra_memory_bytes_max'])
    self.assertLessEqual(rows['pvt_half']['client_extra_memory_bytes_max'], 1.2 * all_vars)
    self.assertIn('extra mem MiB', table)
    self.assertIn('process.next on empty clients', table)

  def test_select_vs_broadcast_mode(self):
    with flagsaver.flagsaver(
        benchmark_select_buckets=['1', '5'], benchmark_select_keys=10,
        benchmark_select_clients=2, benchmark_select_row_dim=3,
        output_dir=self.output_dir):
      benchmark.main(['benchmark'])
    with open(os.path.join(self.output_dir, 'benchmark.json')) as f:
      rows = json.load(f)['select_vs_broadcast']
    self.assertEqual([(r['bucket_size'], r['implementation']) for r in rows],
                     [(1, 'federated_select'), (1, 'broadcast_gather'),
                      (5, 'federated_select'), (5, 'broadcast_gather')])
    self.assertEqual([r['select_calls_per_client'] for r in rows], [10, 0, 2, 0])
    self.assertEqual([r['bytes_per_client'] for r in rows], [10 * 3 * 4] * 4)
    for r in rows:
      self.assertGreater(r['select_s'], 0.0)
      self.assertAlmostEqual(r['ratio'], r['select_s'] / r['broadcast_s'])
    with open(os.path.join(self.output_dir, 'benchmark.md')) as f:
      self.assertIn('| federated_select | 5 | 2 |', f.read())

  def test_bad_flags_are_one_line_errors(self):
    for overrides, message in (
        (dict(benchmark_configs=['nope']), 'unknown preset'),
        (dict(benchmark_references=['keras']), '--benchmark_references'),
        (dict(benchmark_config=['justaname']), 'NAME:ALGORITHM')):
      with flagsaver.flagsaver(task='emnist_cnn', data_source='synthetic', **overrides):
        with self.assertRaises(SystemExit) as e:
          benchmark.main(['benchmark'])
        self.assertIn(message, str(e.exception))
        self.assertTrue(str(e.exception).startswith('error: '))


if __name__ == '__main__':
  absltest.main()
