"""Tests of the sweep's spec, plan, learning-rate choice and summary arithmetic (no training)."""

import json
import math
import os

from absl.testing import absltest
import numpy as np

from tff_partial.sweep import driver
from tff_partial.sweep import lr_search
from tff_partial.sweep import manifest
from tff_partial.sweep import plan
from tff_partial.sweep import spec as spec_lib
from tff_partial.sweep import summary

_BASE = {'task': 'emnist_2nn', 'total_rounds': 3}


def _spec(**overrides):
  data = {'name': 's', 'base': dict(_BASE)}
  data.update(overrides)
  return spec_lib.from_dict(data)


class SpecTest(absltest.TestCase):

  def test_configs_cross_entries_with_the_grid_and_their_own_grids(self):
    spec = _spec(
        configs=[{'name': 'fedavg', 'flags': {'algorithm': 'fedavg'}},
                 {'name': 'select', 'flags': {'algorithm': 'select', 'select_layer': ['conv2']},
                  'grid': {'select_keys': [4, 8]}}],
        grid={'client_epochs': [1, 2]})
    configs = spec.expand()
    self.assertEqual([c.name for c in configs], [
        'fedavg+client_epochs=1', 'fedavg+client_epochs=2',
        'select+client_epochs=1+select_keys=4', 'select+client_epochs=1+select_keys=8',
        'select+client_epochs=2+select_keys=4', 'select+client_epochs=2+select_keys=8'])
    last = configs[-1]
    self.assertEqual(dict(last.flags), {
        'task': 'emnist_2nn', 'total_rounds': 3, 'algorithm': 'select',
        'select_layer': ['conv2'], 'client_epochs': 2, 'select_keys': 8})
    self.assertEqual(dict(last.own_flags), {
        'algorithm': 'select', 'select_layer': ['conv2'], 'client_epochs': 2, 'select_keys': 8})
    self.assertEqual(spec_lib.flag_argv(last.own_flags), [
        '--algorithm=select', '--select_layer=conv2', '--client_epochs=2', '--select_keys=8'])

  def test_lr_from_points_at_the_config_with_the_same_top_level_grid_values(self):
    spec = _spec(
        configs=[{'name': 'fedavg'},
                 {'name': 'select', 'flags': {'algorithm': 'select'},
                  'grid': {'select_keys': [4, 8]}, 'lr_from': 'fedavg'}],
        grid={'client_epochs': [1, 2]},
        lr_search={'grid': {'client_learning_rate': [0.01, 0.1]}})
    by_name = {c.name: c for c in spec.expand()}
    select = by_name['select+client_epochs=2+select_keys=8']
    self.assertEqual(select.lr_from, 'fedavg+client_epochs=2')
    self.assertFalse(select.tune)
    self.assertTrue(by_name['fedavg+client_epochs=2'].tune)

  def test_plan_has_search_runs_then_seed_major_runs_with_dependencies(self):
    spec = _spec(
        configs=[{'name': 'a'}, {'name': 'b', 'lr_from': 'a'}, {'name': 'c', 'lr_search': False}],
        seeds=[3, 4],
        lr_search={'grid': {'client_learning_rate': [0.01, 0.1]}, 'seeds': [7],
                   'flags': {'total_rounds': 2}, 'validation_fraction': 0.2})
    runs = plan.plan_runs(spec, spec.expand(), default_total_rounds=10)
    self.assertEqual([r.run_id for r in runs], [
        'lr_search/a/client_learning_rate=0.01/seed_7', 'lr_search/a/client_learning_rate=0.1/seed_7',
        'runs/a/seed_3', 'runs/b/seed_3', 'runs/c/seed_3',
        'runs/a/seed_4', 'runs/b/seed_4', 'runs/c/seed_4'])
    self.assertEqual([r.total_rounds for r in runs], [2, 2, 3, 3, 3, 3, 3, 3])
    by_id = {r.run_id: r for r in runs}
    self.assertEqual(plan.dependencies(by_id['runs/b/seed_4'], runs), [
        'lr_search/a/client_learning_rate=0.01/seed_7',
        'lr_search/a/client_learning_rate=0.1/seed_7'])
    self.assertEqual(plan.dependencies(by_id['runs/c/seed_3'], runs), [])
    search_argv = plan.train_argv('/sw', by_id['lr_search/a/client_learning_rate=0.1/seed_7'])
    self.assertEqual(search_argv, [
        '--task=emnist_2nn', '--total_rounds=2', '--client_learning_rate=0.1',
        '--eval_split=validation', '--validation_fraction=0.2', '--seed=7',
        '--root_output_dir=/sw/lr_search/a/client_learning_rate=0.1',
        '--experiment_name=seed_7'])
    self.assertEqual(plan.train_argv('/sw', by_id['runs/b/seed_3'], {'client_learning_rate': 0.01}), [
        '--task=emnist_2nn', '--total_rounds=3', '--client_learning_rate=0.01', '--seed=3',
        '--root_output_dir=/sw/runs/b', '--experiment_name=seed_3'])
    with self.assertRaisesRegex(ValueError, 'needs the values chosen by the search of a'):
      plan.train_argv('/sw', by_id['runs/b/seed_3'])

  def test_a_config_may_search_its_own_grid(self):
    spec = _spec(
        configs=[{'name': 'mean'},
                 {'name': 'dp', 'flags': {'aggregator': 'dp_gaussian'},
                  'lr_search': {'grid': {'client_learning_rate': [0.1], 'clip_norm': [0.1, 1.0]}}}],
        lr_search={'grid': {'client_learning_rate': [0.03, 0.1]}})
    runs = plan.plan_runs(spec, spec.expand(), 10)
    self.assertEqual([r.run_id for r in runs if r.is_search], [
        'lr_search/mean/client_learning_rate=0.03/seed_0',
        'lr_search/mean/client_learning_rate=0.1/seed_0',
        'lr_search/dp/client_learning_rate=0.1+clip_norm=0.1/seed_0',
        'lr_search/dp/client_learning_rate=0.1+clip_norm=1.0/seed_0'])

  def test_top_level_search_grid_may_be_left_out_when_every_config_has_its_own(self):
    own = {'grid': {'client_learning_rate': [0.1, 1.0]}}
    spec = _spec(
        configs=[{'name': 'a', 'lr_search': own}, {'name': 'b', 'lr_from': 'a'},
                 {'name': 'c', 'lr_search': False}],
        lr_search={'flags': {'total_rounds': 3}})
    runs = plan.plan_runs(spec, spec.expand(), 10)
    self.assertEqual([r.run_id for r in runs if r.is_search], [
        'lr_search/a/client_learning_rate=0.1/seed_0',
        'lr_search/a/client_learning_rate=1.0/seed_0'])
    with self.assertRaisesRegex(
        spec_lib.SpecError, r'unless every searched config .*"configs"\[1\] "b" has none'):
      _spec(configs=[{'name': 'a', 'lr_search': own}, {'name': 'b'}],
            lr_search={'flags': {'total_rounds': 3}})

  def test_bad_specs_name_the_key(self):
    cases = [
        ({'base': {'seed': 1}}, r'"base": --seed is set by the sweep'),
        ({'base': {'--task': 'x'}}, 'without dashes'),
        ({'grid': {'client_epochs': []}}, 'non-empty list'),
        ({'grid': {'client_epochs': [1, 1]}}, 'lists a value twice'),
        ({'seeds': [0, 0]}, 'distinct integers'),
        ({'configs': [{'name': 'a'}, {'name': 'a'}]}, "'a' appears twice"),
        ({'configs': [{'name': 'a', 'lr_from': 'b'}],
          'lr_search': {'grid': {'client_learning_rate': [0.1]}}}, 'no config named'),
        ({'configs': [{'name': 'a', 'lr_search': False}, {'name': 'b', 'lr_from': 'a'}],
          'lr_search': {'grid': {'client_learning_rate': [0.1]}}}, 'not searched'),
        ({'lr_search': {'grid': {}}}, 'at least one flag'),
        ({'configs': [{'name': 'a', 'lr_search': 'yes'}]}, r'must be true, false or \{"grid"'),
        ({'configs': [{'name': 'a', 'lr_search': {'grid': {}}}],
          'lr_search': {'grid': {'x': [1]}}}, r'"configs"\[0\].lr_search.grid must name'),
        ({'lr_search': {'grid': {'x': [1]}, 'validation_fraction': 1.5}}, r'in \(0, 1\)'),
        ({'bogus': 1}, "unknown key\\(s\\) 'bogus'"),
        ({'configs': [{'name': 'a', 'flags': {'client_epochs': 1}, 'grid': {'client_epochs': [2]}}]},
         'in its grid and also'),
    ]
    for overrides, pattern in cases:
      with self.subTest(pattern=pattern):
        with self.assertRaisesRegex(spec_lib.SpecError, pattern):
          _spec(**overrides)

  def test_merge_overrides_and_digest(self):
    data = spec_lib.merge_overrides(
        {'name': 'x', 'base': {'task': 'emnist_2nn'}}, set_flags=['--total_rounds=5'],
        grid=['client_learning_rate=0.1,0.2'], seeds=[1, 2],
        lr_grid=['server_learning_rate=0.5,1'])
    self.assertEqual(data, {
        'name': 'x', 'base': {'task': 'emnist_2nn', 'total_rounds': '5'},
        'grid': {'client_learning_rate': ['0.1', '0.2']}, 'seeds': [1, 2],
        'lr_search': {'grid': {'server_learning_rate': [0.5, 1.0]}}})
    spec = spec_lib.from_dict(data)
    described = spec_lib.from_dict(dict(data, description='other words', name='y'))
    self.assertEqual(spec.digest(), described.digest())
    more_seeds = spec_lib.from_dict(dict(data, seeds=[1, 2, 3]))
    self.assertNotEqual(spec.digest(), more_seeds.digest())
    with self.assertRaisesRegex(spec_lib.SpecError, 'expected flag=value'):
      spec_lib.merge_overrides({}, grid=['client_learning_rate'])


class OnlyTest(absltest.TestCase):

  def test_only_keeps_the_matching_configs_and_the_searches_they_need(self):
    spec = _spec(
        configs=[{'name': 'fedavg'},
                 {'name': 'select', 'grid': {'select_keys': [4, 8]}, 'lr_from': 'fedavg'},
                 {'name': 'other'}],
        lr_search={'grid': {'client_learning_rate': [0.01, 0.1]}})
    checked = []

    def check_fn(argvs):
      checked.extend(argvs)
      return [None] * len(argvs), 10

    train = driver.TrainInterface(command=['x'], check_fn=check_fn)
    root = self.create_tempdir().full_path
    prepared = driver.prepare(spec, os.path.join(root, 's'), train, only=['select+*=8'])
    self.assertEqual([c.name for c in prepared.configs], ['select+select_keys=8'])
    self.assertEqual([r.run_id for r in prepared.runs], [
        'lr_search/fedavg/client_learning_rate=0.01/seed_0',
        'lr_search/fedavg/client_learning_rate=0.1/seed_0', 'runs/select+select_keys=8/seed_0'])
    self.assertLen(checked, 2 + 2 + 4)  # every config and search trial is still checked
    with self.assertRaisesRegex(spec_lib.SpecError, '--only=nothing matches no config'):
      driver.prepare(spec, os.path.join(root, 's'), train, only=['nothing'])


class ManifestTest(absltest.TestCase):

  def test_other_spec_and_foreign_directory_are_refused(self):
    root = self.create_tempdir().full_path
    spec = _spec()
    self.assertFalse(manifest.check(root, spec))  # empty: new
    manifest.write(root, spec, 10)
    self.assertTrue(manifest.check(root, spec))
    with self.assertRaisesRegex(manifest.SweepDirError, 'belongs to sweep .s. with another spec'):
      manifest.check(root, _spec(seeds=[5]))
    foreign = self.create_tempdir().full_path
    with open(os.path.join(foreign, 'notes.txt'), 'w') as f:
      f.write('x')
    with self.assertRaisesRegex(manifest.SweepDirError, 'not a sweep directory'):
      manifest.check(foreign, spec)

  def test_lock_is_exclusive(self):
    root = self.create_tempdir().full_path
    with manifest.Lock(root):
      with self.assertRaisesRegex(manifest.SweepDirError, 'another sweep process'):
        with manifest.Lock(root):
          pass
    with manifest.Lock(root):  # released
      pass


def _write_run(directory, rows, final):
  os.makedirs(directory, exist_ok=True)
  columns = ['round_num', 'comm/bytes_down_per_client', 'comm/bytes_up_per_client',
             'evaluation/accuracy', 'evaluation/loss']
  with open(os.path.join(directory, 'metrics.csv'), 'w') as f:
    f.write(','.join(columns) + '\n')
    for row in rows:
      f.write(','.join('' if v is None else str(v) for v in row) + '\n')
  with open(os.path.join(directory, 'final_eval.json'), 'w') as f:
    json.dump(final, f)


class SummaryTest(absltest.TestCase):

  def test_describe_matches_a_hand_computed_t_interval(self):
    st = summary.describe([0.70, 0.72, 0.74])
    self.assertEqual(st.n, 3)
    self.assertAlmostEqual(st.mean, 0.72)
    self.assertAlmostEqual(st.std, 0.02)
    # t(0.975, 2 dof) = 4.302653; half width = 4.302653 * 0.02 / sqrt(3).
    half = 4.302653 * 0.02 / math.sqrt(3)
    self.assertAlmostEqual(st.ci_low, 0.72 - half, places=6)
    self.assertAlmostEqual(st.ci_high, 0.72 + half, places=6)
    one = summary.describe([0.5])
    self.assertEqual((one.n, one.mean), (1, 0.5))
    self.assertTrue(math.isnan(one.std) and math.isnan(one.ci_low))

  def test_plateau_round(self):
    rounds = list(range(1, 11))
    # Rises to 0.5 by round 4, then stays: with window 1 the plateau is round 4.
    values = [0.1, 0.3, 0.45, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    self.assertEqual(summary.plateau_round(rounds, values, tolerance=0.01, window=1), 4)
    # Window 3: smoothed = [.1, .2, .283, .417, .483, .5, ...]; within 0.01 from round 6.
    np.testing.assert_allclose(summary.smooth(values, 3)[:5], [0.1, 0.2, 0.85 / 3, 1.25 / 3, 1.45 / 3])
    self.assertEqual(summary.plateau_round(rounds, values, tolerance=0.01, window=3), 6)
    # Still rising at the end: the plateau is the last round.
    self.assertEqual(summary.plateau_round(rounds, np.linspace(0, 1, 10), tolerance=0.01,
                                           window=1), 10)

  def test_read_run_keeps_the_last_row_of_a_round_and_sums_bytes(self):
    root = self.create_tempdir().full_path
    spec = _spec(seeds=[0])
    run = plan.plan_runs(spec, spec.expand(), 10)[0]
    # A resumed run wrote round 2 twice; evaluations every other round.
    _write_run(plan.run_dir(root, run), [
        (0, 100, 50, 0.0, 4.0), (1, 100, 50, None, None), (2, 100, 50, 0.2, 3.0),
        (2, 100, 50, 0.25, 2.9), (3, 100, 50, 0.3, 2.5)], {'accuracy': 0.3, 'loss': 2.5})
    result = summary.read_run(root, run, 'accuracy')
    self.assertEqual(result.rounds.tolist(), [0, 2, 3])
    np.testing.assert_allclose(result.metric, [0.0, 0.25, 0.3])
    self.assertEqual(result.cumulative_bytes.tolist(), [0, 300, 450])
    self.assertEqual((result.bytes_down, result.bytes_up), (300, 150))


class LrChoiceTest(absltest.TestCase):

  def test_best_mean_validation_metric_then_lower_loss(self):
    root = self.create_tempdir().full_path
    spec = _spec(configs=[{'name': 'a'}], lr_search={
        'grid': {'client_learning_rate': [0.01, 0.1, 1.0]}, 'seeds': [0, 1]})
    runs = plan.plan_runs(spec, spec.expand(), 10)
    scores = {('0.01', 0): (0.5, 1.0), ('0.01', 1): (0.7, 1.0),   # mean 0.6, loss 1.0
              ('0.1', 0): (0.6, 0.8), ('0.1', 1): (0.6, 0.8),     # mean 0.6, loss 0.8
              ('1.0', 0): (0.9, 0.1)}                             # seed 1 unfinished
    for run in runs:
      key = (str(run.trial_flags.get('client_learning_rate')), run.seed)
      if run.is_search and key in scores:
        accuracy, loss = scores[key]
        _write_run(plan.run_dir(root, run), [(0, 1, 1, accuracy, loss)],
                   {'accuracy': accuracy, 'loss': loss})
    choice = lr_search.choose(root, runs, 'a', spec.lr_search)
    self.assertEqual(choice.values, {'client_learning_rate': 0.1})
    self.assertAlmostEqual(choice.score, 0.6)
    self.assertTrue(math.isnan(choice.trials[2].mean))
    with self.assertRaisesRegex(ValueError, 'no learning-rate search run of b'):
      lr_search.choose(root, runs, 'b', spec.lr_search)


if __name__ == '__main__':
  absltest.main()
