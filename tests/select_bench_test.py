"""Tests of tff_partial/select/bench.py (tiny sizes: it runs, counts right)."""

import tensorflow as tf

from tff_partial.select import bench


class BenchTest(tf.test.TestCase):

  def test_bucketed_select_and_broadcast_same_payload(self):
    result = bench.time_select_vs_broadcast(
        num_keys=20, clients=2, row_dim=3, bucket_size=5, repeats=1)
    self.assertEqual(result['select_calls_per_client'], 4)
    self.assertEqual(result['bytes_per_client'], 20 * 3 * 4)
    self.assertGreater(result['select_s'], 0.0)
    self.assertGreater(result['broadcast_s'], 0.0)

  def test_bad_sizes(self):
    with self.assertRaisesRegex(ValueError, 'bucket_size'):
      bench.time_select_vs_broadcast(num_keys=4, bucket_size=0)


if __name__ == '__main__':
  tf.test.main()
