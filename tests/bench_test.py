"""Tests of tff_partial/bench: configurations, reports, machine header, fits."""

import os
from unittest import mock

import psutil
import tensorflow as tf

from tff_partial.bench import configs
from tff_partial.bench import machine
from tff_partial.bench import references
from tff_partial.bench import report
from tff_partial.bench import scaling
from tff_partial.bench import worker_settings
from tff_partial.training import client_loop

_ALGORITHMS = ('tff_fedavg', 'fedavg', 'fedpt')


class ConfigsTest(tf.test.TestCase):

  def test_custom_config(self):
    c = configs.parse_custom('f:fedpt:frozen_layers=dense1;frozen_order=input_first',
                             _ALGORITHMS)
    self.assertEqual((c.name, c.algorithm), ('f', 'fedpt'))
    self.assertEqual(c.overrides, {'frozen_layers': 'dense1', 'frozen_order': 'input_first'})

  def test_bad_custom_config_is_a_clear_error(self):
    with self.assertRaisesRegex(ValueError, 'NAME:ALGORITHM'):
      configs.parse_custom('justaname', _ALGORITHMS)
    with self.assertRaisesRegex(ValueError, 'valid values: tff_fedavg, fedavg'):
      configs.parse_custom('x:sgd:', _ALGORITHMS)
    with self.assertRaisesRegex(ValueError, 'is not FLAG=VALUE'):
      configs.parse_custom('x:fedavg:client_loop', _ALGORITHMS)

  def test_select_presets(self):
    chosen = configs.select('emnist_cnn', None, ['x:fedavg:'], _ALGORITHMS)
    self.assertEqual([c.name for c in chosen],
                     list(configs.TASK_PRESETS['emnist_cnn']) + ['x'])
    with self.assertRaisesRegex(ValueError, 'given twice'):
      configs.select('emnist_cnn', ['fedavg'], ['fedavg:fedavg:'], _ALGORITHMS)
    with self.assertRaisesRegex(ValueError, 'unknown preset'):
      configs.select('emnist_cnn', ['nope'], [], _ALGORITHMS)


class ScalingTest(tf.test.TestCase):

  def test_linear_fit(self):
    fit = scaling.linear_fit([10, 50, 100], [1.5, 5.5, 10.5])
    self.assertAlmostEqual(fit['slope'], 0.1)
    self.assertAlmostEqual(fit['intercept'], 0.5)
    self.assertAlmostEqual(fit['r2'], 1.0)


class ReportTest(tf.test.TestCase):

  def _rows(self):
    def row(name, wall, cpu, bytes_):
      return {'name': name, 'median_round_seconds': wall, 'median_round_cpu_seconds': cpu,
              'examples_per_round': 100.0, 'examples_per_second': 100.0 / wall,
              'bytes_down_per_client': bytes_, 'bytes_up_per_client': bytes_}
    rows = [row('tff_fedavg', 2.0, 4.0, 40), row('fedavg', 1.0, 3.0, 40),
            {'name': 'select', 'skipped': 'not here'}]
    refs = [{'name': references.LIMIT, 'median_round_seconds': 0.8,
             'median_round_cpu_seconds': 1.5, 'examples_per_round': 100.0,
             'examples_per_second': 125.0}]
    return rows, refs

  def test_ratios(self):
    rows, refs = self._rows()
    report.add_ratios(rows, refs)
    fedavg = rows[1]
    self.assertAlmostEqual(fedavg['round_time_vs_tff_fedavg'], 0.5)
    self.assertAlmostEqual(fedavg['round_cpu_vs_tff_fedavg'], 0.75)
    self.assertAlmostEqual(fedavg['bytes_vs_tff_fedavg'], 1.0)
    self.assertAlmostEqual(fedavg['throughput_vs_limit'], 100.0 / 125.0)
    self.assertAlmostEqual(fedavg['cpu_throughput_vs_limit'], 1.5 / 3.0)
    self.assertAlmostEqual(refs[0]['throughput_vs_limit'], 1.0)
    self.assertNotIn('throughput_vs_limit', rows[2])

  def test_markdown(self):
    rows, refs = self._rows()
    report.add_ratios(rows, refs)
    text = report.markdown({
        'task': 't', 'machine': 'CPU: x', 'data': 'd', 'clients_per_round': 2,
        'rounds': 3, 'warmup_rounds': 1, 'client_batch_size': 20, 'client_epochs': 1,
        'client_max_batches': -1, 'seed': 0, 'runtime': 'r', 'method_note': 'n',
        'rows': rows, 'references': refs, 'load_at_end': '1.0/1.0/1.0'})
    self.assertIn('| fedavg | 1 | 3 | 0.5 | 0.75 | - | 100 | 0.8 | 0.5 | 0.0 | 0.0 | 1 |', text)
    self.assertIn('| select | skipped: not here |', text)
    self.assertIn(f'| {references.LIMIT} | 0.8 | 1.5 |', text)
    self.assertIn('epochs 1, max batches -1,', text)
    per_epoch = report.markdown({
        'task': 't', 'machine': 'CPU: x', 'data': 'd', 'clients_per_round': 2,
        'rounds': 3, 'warmup_rounds': 1, 'client_batch_size': 20, 'client_epochs': 2,
        'client_epoch_batching': 'per_epoch', 'client_max_batches': 10, 'seed': 0,
        'runtime': 'r', 'method_note': 'n'})
    self.assertIn('epochs 2 (batched per epoch), max batches 10,', per_epoch)


class ReferencesTest(tf.test.TestCase):

  def test_in_memory_turns_autotuning_off_unless_asked(self):
    dataset = tf.data.Dataset.range(5).batch(2)
    off = references.in_memory(dataset)
    on = references.in_memory(dataset, autotune=True)
    self.assertFalse(off.options().autotune.enabled)
    self.assertIsNone(on.options().autotune.enabled)  # tf.data's default: on.
    self.assertEqual([list(b.numpy()) for b in off], [[0, 1], [2, 3], [4]])

  def test_reference_names(self):
    self.assertEqual(references.LIMIT, 'keras_in_memory')
    self.assertEqual(references.ALL_NAMES, references.NAMES + ('keras_in_memory_autotune',))
    with self.assertRaisesRegex(ValueError, "unknown reference 'keras'; valid values: "
                                'keras_in_memory, keras_tff_data_path, tf_function_floor, '
                                'keras_in_memory_autotune'):
      references.make_references(['keras'], None, 0, 0.1, None)


class MachineTest(tf.test.TestCase):

  def test_onednn_env_and_header(self):
    for value, env, worker in (('0', False, False), ('1', True, True), (None, None, True)):
      environ = {} if value is None else {'TF_ENABLE_ONEDNN_OPTS': value}
      with mock.patch.dict(os.environ, environ, clear=True):
        self.assertEqual(machine.onednn_env(), env)
        self.assertEqual(machine.worker_onednn(), worker)
        self.assertEqual(client_loop.worker_onednn(), worker)
    with mock.patch.dict(os.environ, {'TF_ENABLE_ONEDNN_OPTS': '0'}):
      path = machine.cpu_path()
    self.assertStartsWith(path, machine.cpu_model() + '; AVX-512 ')
    self.assertEndsWith(path, f'; oneDNN {"on" if machine.python_onednn() else "off"} '
                        '(TF_ENABLE_ONEDNN_OPTS=0)')
    header = machine.describe().header()
    self.assertRegex(header, r'^CPU: .+, \d+ cores, AVX-512 (yes|no), ')
    self.assertRegex(header, r'oneDNN: .* -> Python TF (on|off), TFF worker (on|off)')

  def test_cpu_model_names_family_and_model(self):
    # The first processor's block of /proc/cpuinfo, as on the 2-core Zen 4 of 2026-12-05.
    cpuinfo = ('processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n'
               'model name\t: AMD EPYC\nstepping\t: 0\n\nprocessor\t: 1\ncpu family\t: 26\n'
               'model\t\t: 2\nmodel name\t: other\n')
    with mock.patch('builtins.open', mock.mock_open(read_data=cpuinfo)):
      self.assertEqual(machine.cpu_model(), 'AMD EPYC (family 25, model 17)')
    with mock.patch('builtins.open', mock.mock_open(read_data='model name\t: Some ARM\n')):
      self.assertEqual(machine.cpu_model(), 'Some ARM')
    with mock.patch('builtins.open', side_effect=OSError), \
         mock.patch('platform.processor', return_value=''):
      self.assertEqual(machine.cpu_model(), 'unknown CPU')


class WorkerSettingsTest(tf.test.TestCase):

  def test_split(self):
    settings, rest = worker_settings.split(
        {'worker_intra_op_threads': '1', 'client_loop': 'reduce'})
    self.assertEqual(settings, {'worker_intra_op_threads': 1})
    self.assertEqual(rest, {'client_loop': 'reduce'})
    with self.assertRaisesRegex(ValueError, 'worker_max_concurrent_calls=.x. is not an integer'):
      worker_settings.split({'worker_max_concurrent_calls': 'x'})

  def test_local_context_starts_a_worker_with_the_settings(self):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    env_before = dict(os.environ)
    context = worker_settings.local_context(
        worker_max_concurrent_calls=2, worker_intra_op_threads=1,
        worker_inter_op_threads=1)
    self.assertIsNotNone(context)
    self.assertEqual(dict(os.environ), env_before)  # this process is unchanged
    new = [p for p in psutil.Process().children(recursive=True)
           if p.pid not in before and p.name().startswith('worker_binary')]
    self.assertLen(new, 1)
    self.assertIn('--max_concurrent_computation_calls=2', new[0].cmdline())
    self.assertEqual(new[0].environ().get('TF_NUM_INTRAOP_THREADS'), '1')
    self.assertEqual(new[0].environ().get('TF_NUM_INTEROP_THREADS'), '1')
    new[0].kill()


class ClientLoopTest(tf.test.TestCase):

  def test_resolve(self):
    self.assertEqual(client_loop.resolve('iterator', 'any'), 'iterator')
    self.assertEqual(client_loop.resolve('reduce', 'any'), 'reduce')
    # A task or CPU not measured: TFF's default.
    self.assertEqual(client_loop.resolve('auto', 'not_a_task', onednn=True, avx512=True),
                     'reduce')
    # Measured on a CPU without AVX-512 (docs/benchmark_results/client_loop_no_avx512/)
    # and on one with it (client_loop_avx512_intel/): the iterator loop for every task
    # but the Stack Overflow transformer, on either.
    for onednn in (False, True):
      for avx512 in (False, True):
        self.assertEqual(
            client_loop.resolve('auto', 'cifar10_resnet18', onednn=onednn, avx512=avx512),
            'iterator')
        self.assertEqual(
            client_loop.resolve('auto', 'stackoverflow_nwp', onednn=onednn, avx512=avx512),
            'reduce')
    self.assertLen(client_loop.MEASURED_FASTER, 32)  # 8 tasks x 2 oneDNN paths x AVX-512 or not
    for (task, onednn, avx512), loop in client_loop.MEASURED_FASTER.items():
      self.assertEqual(client_loop.resolve('auto', task, onednn=onednn, avx512=avx512), loop)
    with self.assertRaisesRegex(ValueError, '--client_loop=.*valid values: auto'):
      client_loop.resolve('fast', 'x')


if __name__ == '__main__':
  tf.test.main()
