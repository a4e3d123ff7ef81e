"""scripts.benchmark --benchmark_cohorts over local workers: cost and memory per cohort."""
# bazel: size=large

import json
import os
import shutil
import tempfile

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver

from scripts import benchmark

FLAGS = flags.FLAGS


class BenchmarkCohortsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    if not FLAGS.is_parsed():
      FLAGS(['benchmark_cohorts_test'])
    self.output_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.output_dir, ignore_errors=True)

  def test_sweep_over_local_workers_reports_each_workers_peak_memory(self):
    with flagsaver.flagsaver(
        task='emnist_2nn', data_source='synthetic', benchmark_cohorts=['2', '4'],
        benchmark_configs=['fedavg'], benchmark_rounds=2, benchmark_warmup_rounds=1,
        client_max_batches=1, benchmark_local_workers=2,
        worker_max_clients_per_subround=1, output_dir=self.output_dir):
      benchmark.main(['benchmark'])
    with open(os.path.join(self.output_dir, 'benchmark.json')) as f:
      report = json.load(f)
    with open(os.path.join(self.output_dir, 'benchmark.md')) as f:
      table = f.read()
    self.assertEqual(report['cohorts'], [2, 4])
    self.assertEqual(report['runtime'], '2 local workers, at most 1 clients per sub-round')
    fedavg = report['scaling']['fedavg']
    self.assertLen(fedavg['median_round_seconds'], 2)
    self.assertLen(fedavg['median_round_cpu_seconds'], 2)
    self.assertEqual(set(fedavg['cpu_fit']), {'slope', 'intercept', 'r2'})
    # One entry per cohort, one value per worker; every worker trained
    # clients (2 and 4 sub-rounds of one client on 2 workers).
    self.assertLen(report['worker_peak_rss_bytes'], 2)
    for peaks, cpus in zip(report['worker_peak_rss_bytes'], report['worker_cpu_seconds']):
      self.assertLen(peaks, 2)
      for peak, cpu in zip(peaks, cpus):
        self.assertGreater(peak, 50 * 2**20)  # a TensorFlow runtime is resident
        self.assertGreater(cpu, 0.0)
    self.assertLen(report['coordinator_peak_rss_bytes'], 2)
    self.assertIn('| worker 2 peak RSS GiB |', table)
    self.assertIn('| fedavg CPU s |', table)


if __name__ == '__main__':
  absltest.main()
