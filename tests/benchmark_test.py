"""Smoke test of scripts.benchmark main(): synthetic data, 2 clients, 2 rounds."""

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
    self.assertGreater(report['keras']['examples_per_second'], 0.0)
    self.assertGreater(rows['fedavg']['throughput_vs_keras'], 0.0)
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

  def test_select_vs_broadcast_mode(self):
    with flagsaver.flagsaver(
        benchmark_select_buckets=['1', '5'], benchmark_select_keys=10,
        benchmark_select_clients=2, benchmark_select_row_dim=3,
        output_dir=self.output_dir):
      benchmark.main(['benchmark'])
    with open(os.path.join(self.output_dir, 'benchmark.json')) as f:
      rows = json.load(f)['select_vs_broadcast']
    self.assertEqual([r['bucket_size'] for r in rows], [1, 5])
    self.assertEqual([r['select_calls_per_client'] for r in rows], [10, 2])
    self.assertEqual([r['bytes_per_client'] for r in rows], [10 * 3 * 4] * 2)
    for r in rows:
      self.assertGreater(r['select_s'], 0.0)
      self.assertAlmostEqual(r['ratio'], r['select_s'] / r['broadcast_s'])
    with open(os.path.join(self.output_dir, 'benchmark.md')) as f:
      self.assertIn('| 5 | 2 |', f.read())

  def test_bad_custom_config_is_a_clear_error(self):
    with self.assertRaisesRegex(ValueError, 'NAME:ALGORITHM'):
      benchmark.parse_custom('justaname')
    with self.assertRaisesRegex(ValueError, 'valid values: tff_fedavg, fedavg'):
      benchmark.parse_custom('x:sgd:')

  def test_linear_fit(self):
    fit = benchmark.linear_fit([10, 50, 100], [1.5, 5.5, 10.5])
    self.assertAlmostEqual(fit['slope'], 0.1)
    self.assertAlmostEqual(fit['intercept'], 0.5)
    self.assertAlmostEqual(fit['r2'], 1.0)


if __name__ == '__main__':
  absltest.main()
