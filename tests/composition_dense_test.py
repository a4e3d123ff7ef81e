"""Composition matrix (FedAvg, FedPT) x (mean, median, dp_gaussian, dp_ftrl).

See tests/composition_testing.py for the cases and the numpy reference.
"""

# bazel: size=large
import tensorflow as tf

from tests import composition_testing


class DenseMethodsMatrixTest(composition_testing.MatrixTestCase):

  def test_fedavg(self):
    self.check_method('fedavg')

  def test_fedpt(self):
    self.check_method('fedpt')


if __name__ == '__main__':
  tf.test.main()
