"""Tests of the EMNIST / FEMNIST tasks (tasks/emnist.py) on the LEAF sample."""

import tensorflow as tf

from tasks import emnist
from tasks import registry
from tests import task_testing
from tests import testing_utils


class ModelTest(tf.test.TestCase):

  def test_param_counts(self):
    # conv1 5*5*1*32+32 = 832; conv2 5*5*32*64+64 = 51,264;
    # dense1 (7*7*64)*512+512 = 1,606,144; dense2 512*62+62 = 31,806.
    self.assertEqual(task_testing.param_count(emnist.create_cnn()), 1_690_046)
    # + GroupNorm gamma and beta over 64 channels = 128.
    self.assertEqual(task_testing.param_count(emnist.create_cnn(group_norm=True)), 1_690_174)
    # 784*200+200 = 157,000; 200*200+200 = 40,200; 200*62+62 = 12,462.
    self.assertEqual(task_testing.param_count(emnist.create_2nn()), 209_662)

  def test_layer_names(self):
    self.assertEqual([l.name for l in emnist.create_cnn(group_norm=True).layers],
                     ['conv1', 'pool1', 'conv2', 'group_norm', 'pool2', 'flatten',
                      'dense1', 'dense2'])
    self.assertEqual([l.name for l in emnist.create_2nn().layers],
                     ['flatten', 'dense1', 'dense2', 'dense3'])


class FemnistTaskTest(tf.test.TestCase):

  def test_leaf_loading(self):
    train, test = emnist.load_leaf_femnist(
        testing_utils.shared_data(testing_utils.FEMNIST), testing_utils.cache_dir())
    self.assertLen(train.client_ids, 110)
    self.assertLen(test.client_ids, 198)
    self.assertEqual(int(test.create_tf_dataset_from_all_clients().reduce(0, lambda n, _: n + 1)),
                     4_182)

  def test_one_round_on_leaf(self):
    task = registry.create_task(
        'emnist_2nn', train_client_spec=testing_utils.client_spec(batch_size=10, max_elements=20),
        data_source='leaf', data_dir=testing_utils.shared_data(testing_utils.FEMNIST),
        cache_dir=testing_utils.cache_dir())
    self.assertEqual(task.data_source, 'leaf')
    self.assertEqual(task.population, 110)
    self.assertEqual(task.num_test_clients, 198)
    _, _, history = task_testing.run_fedavg(task, num_rounds=1, clients_per_round=3)
    self.assertEqual(history[0]['num_examples'], 60)

  def test_leaf_without_data_dir(self):
    with self.assertRaisesRegex(registry.TaskError, '--data_dir'):
      registry.create_task('emnist_cnn', train_client_spec=testing_utils.client_spec(),
                           data_source='leaf')


if __name__ == '__main__':
  tf.test.main()
