"""Tests of the sweep summary on hand-made run outputs: searches at a grid's edge, CPU paths.

No training: the runs' `final_eval.json`, `metrics.csv` and `flags.json` are
written by hand. The summary's statistics, and that the search trains on the
validation split and its values reach the configs' runs, are checked against
real runs in sweep_test.py.
"""

import csv
import dataclasses
import json
import os

from absl.testing import absltest
import numpy as np

from tff_partial.sweep import carry
from tff_partial.sweep import driver
from tff_partial.sweep import lr_search
from tff_partial.sweep import manifest
from tff_partial.sweep import plan
from tff_partial.sweep import plots
from tff_partial.sweep import spec as spec_lib
from tff_partial.sweep import summary

_PATH_A = 'CPU A; AVX-512 no; oneDNN off (TF_ENABLE_ONEDNN_OPTS=0)'
_PATH_B = 'CPU B; AVX-512 yes; oneDNN on (TF_ENABLE_ONEDNN_OPTS unset)'


def _summarize(test, data, write_run):
  """(summary.md text, summary paths, runs) of the sweep `data` after `write_run(dir, run)`."""
  spec = spec_lib.from_dict(data)
  sweep_dir = test.create_tempdir().full_path
  configs = spec.expand()
  runs = plan.plan_runs(spec, configs, default_total_rounds=1)
  for run in runs:
    write_run(sweep_dir, run)
  prepared = driver.Prepared(spec, sweep_dir, configs, runs, resumed=False,
                             default_total_rounds=1)
  paths = driver.summarize(prepared)
  with open(paths['summary']) as f:
    return f.read(), paths, runs


def _csv_rows(path, key):
  with open(path) as f:
    return {row[key]: row for row in csv.DictReader(f)}


def _write_run(sweep_dir, run, accuracy, cpu_path=None, *, curve=True):
  """A finished run: final_eval.json, and (`curve`) metrics.csv and flags.json."""
  directory = plan.run_dir(sweep_dir, run)
  os.makedirs(directory)
  if curve:
    with open(os.path.join(directory, 'metrics.csv'), 'w') as f:
      f.write('round_num,comm/bytes_down_per_client,comm/bytes_up_per_client,'
              'evaluation/accuracy,evaluation/loss\n'
              f'0,0,0,0.1,4.0\n1,100,50,{accuracy},1.0\n')
    flags = {'seed': run.seed}
    if cpu_path is not None:
      flags['cpu_path_resolved'] = cpu_path
    with open(os.path.join(directory, 'flags.json'), 'w') as f:
      json.dump(flags, f)
  with open(os.path.join(directory, plan.FINISHED_FILE), 'w') as f:
    json.dump({'accuracy': accuracy, 'loss': 1.0 - accuracy}, f)


def _choice(grid, chosen):
  """A Choice over every combination of `grid` (flag -> values) that chose `chosen`."""
  trials = [lr_search.Trial(name, values, {0: 0.5}, {0: 1.0})
            for name, values in spec_lib.LrSearch(grid=grid).trials()]
  return lr_search.Choice(config='c', values=chosen, trials=trials)


class AtEdgeTest(absltest.TestCase):

  def test_smallest_and_largest_values_are_edges(self):
    choice = _choice({'client_learning_rate': (0.01, 0.03, 0.1), 'clip_norm': (0.3, 1.0, 3.0)},
                     {'client_learning_rate': 0.01, 'clip_norm': 3.0})
    self.assertEqual(choice.at_edge, {'client_learning_rate': 'smallest', 'clip_norm': 'largest'})
    self.assertEqual(
        choice.edge_text(),
        'client_learning_rate = 0.01 is the smallest value of its grid (0.01, 0.03, 0.1); '
        'clip_norm = 3 is the largest value of its grid (0.3, 1, 3)')

  def test_an_interior_value_is_no_edge(self):
    choice = _choice({'client_learning_rate': (0.01, 0.03, 0.1), 'clip_norm': (0.3, 1.0, 3.0)},
                     {'client_learning_rate': 0.03, 'clip_norm': 3.0})
    self.assertEqual(choice.at_edge, {'clip_norm': 'largest'})
    choice = _choice({'client_learning_rate': (0.1, 0.01, 0.03)},  # grid order is not value order
                     {'client_learning_rate': 0.03})
    self.assertEqual(choice.at_edge, {})
    self.assertEqual(choice.edge_text(), '')

  def test_flags_not_searched_or_without_order_are_not_judged(self):
    choice = _choice({'client_learning_rate': (0.1,), 'client_optimizer': ('adam', 'sgd')},
                     {'client_learning_rate': 0.1, 'client_optimizer': 'adam'})
    self.assertEqual(choice.at_edge, {})


  def _widened(self, earlier_losses):
    """A loss search over lr 10 / 30 x clip 3 / 10 that chose 10 / 3 (4.812), with earlier trials.

    earlier_losses: (client_learning_rate, clip_norm) -> mean validation loss
    of a trial an earlier sweep ran outside this grid (None: unfinished).
    """
    losses = {(10.0, 3.0): 4.812, (10.0, 10.0): 5.156, (30.0, 3.0): 4.851, (30.0, 10.0): 4.973}

    def trial(lr, clip, loss):
      return lr_search.Trial(f'client_learning_rate={lr}+clip_norm={clip}',
                             {'client_learning_rate': lr, 'clip_norm': clip},
                             {0: loss}, {0: loss})

    return lr_search.Choice(
        config='c', values={'client_learning_rate': 10.0, 'clip_norm': 3.0},
        trials=[trial(lr, clip, loss) for (lr, clip), loss in losses.items()],
        earlier=[trial(lr, clip, loss) for (lr, clip), loss in earlier_losses.items()],
        maximize=False)

  def test_earlier_trials_beyond_an_edge_that_all_lost_bracket_it(self):
    # The z = 0.3 chain of dp_fedpt_shakespeare_word: lr 3 and clip 1 lost in the first spec.
    choice = self._widened({(3.0, 1.0): 5.014, (3.0, 3.0): 5.001, (10.0, 1.0): 4.991})
    self.assertEqual(choice.bracketed_by_earlier,
                     {'client_learning_rate': [3.0], 'clip_norm': [1.0]})
    self.assertEqual(choice.at_edge, {})
    self.assertEqual(choice.edge_text(), '')
    self.assertEqual(choice.bracketed_text(),
                     'client_learning_rate = 10 (earlier: 3); clip_norm = 3 (earlier: 1)')

  def test_an_earlier_trial_beyond_an_edge_that_won_or_did_not_finish_leaves_it_open(self):
    choice = self._widened({(3.0, 3.0): 5.001, (10.0, 1.0): 4.70})  # clip 1 beat the choice
    self.assertEqual(choice.at_edge, {'clip_norm': 'smallest'})
    self.assertEqual(choice.bracketed_by_earlier, {'client_learning_rate': [3.0]})
    choice = self._widened({(3.0, 3.0): None, (10.0, 1.0): 4.812})  # unfinished; a tie
    self.assertEqual(choice.at_edge, {'client_learning_rate': 'smallest', 'clip_norm': 'smallest'})
    self.assertEqual(choice.bracketed_by_earlier, {})

  def test_an_earlier_metric_tie_beyond_an_edge_is_judged_by_loss_as_choose_ranks(self):
    # The z = 0.3 FedAvg chain of dp_fedpt_femnist: lr 0.003 tied lr 0.01 on accuracy (77.43)
    # and lost on validation loss, so it would have lost inside the grid too.
    def choice(tie_loss):
      def trial(lr, accuracy, loss):
        return lr_search.Trial(f'client_learning_rate={lr}', {'client_learning_rate': lr},
                               {0: accuracy}, {0: loss})
      return lr_search.Choice(
          config='c', values={'client_learning_rate': 0.01},
          trials=[trial(0.01, 0.7743, 0.80), trial(0.03, 0.7246, 0.95)],
          earlier=[trial(0.001, 0.7032, 1.10), trial(0.003, 0.7743, tie_loss)])

    higher = choice(tie_loss=0.85)
    self.assertEqual(higher.bracketed_by_earlier, {'client_learning_rate': [0.001, 0.003]})
    self.assertEqual(higher.at_edge, {})
    for not_worse in (0.80, 0.75):  # an equal or a lower loss would have won or tied
      self.assertEqual(choice(tie_loss=not_worse).bracketed_by_earlier, {})
      self.assertEqual(choice(tie_loss=not_worse).at_edge, {'client_learning_rate': 'smallest'})

  def test_an_edge_is_judged_in_the_metric_s_direction(self):
    choice = self._widened({(3.0, 3.0): 5.001})
    self.assertEqual(choice.bracketed_by_earlier, {'client_learning_rate': [3.0]})
    as_accuracy = dataclasses.replace(choice, maximize=True)  # 5.001 would then have won
    self.assertEqual(as_accuracy.bracketed_by_earlier, {})
    self.assertEqual(as_accuracy.at_edge,
                     {'client_learning_rate': 'smallest', 'clip_norm': 'smallest'})

  def test_earlier_trials_inside_the_grid_s_range_bracket_nothing(self):
    choice = self._widened({(20.0, 3.0): 6.0})
    self.assertEqual(choice.bracketed_by_earlier, {})
    self.assertEqual(choice.at_edge, {'client_learning_rate': 'smallest', 'clip_norm': 'smallest'})


class SummaryWarnsTest(absltest.TestCase):
  """summary.md and summary.csv name the configs whose searched values sit at an edge."""

  def _summarize(self, best_lr):
    def write_search_run(sweep_dir, run):
      if run.is_search:  # best: best_lr with server lr 1.0
        flags = run.trial_flags
        accuracy = 0.5 - abs(flags['client_learning_rate'] - best_lr) - abs(
            flags['server_learning_rate'] - 1.0) / 10
        _write_run(sweep_dir, run, accuracy, curve=False)

    markdown, paths, _ = _summarize(self, {
        'name': 'edges',
        'base': {'task': 'emnist_2nn', 'data_source': 'synthetic', 'total_rounds': 4},
        'configs': [
            {'name': 'fedavg', 'flags': {'algorithm': 'fedavg'}},
            {'name': 'reused', 'flags': {'algorithm': 'fedavg', 'client_epochs': 2},
             'lr_from': 'fedavg'},
            {'name': 'fixed', 'flags': {'algorithm': 'fedavg', 'client_epochs': 3},
             'lr_search': False}],
        'seeds': [0],
        'lr_search': {'grid': {'client_learning_rate': [0.01, 0.03, 0.1],
                               'server_learning_rate': [0.5, 1.0, 2.0]}},
    }, write_search_run)
    return markdown, _csv_rows(paths['summary_csv'], 'config')

  def test_an_edge_choice_is_named_for_the_config_and_those_that_reuse_its_values(self):
    markdown, rows = self._summarize(best_lr=0.01)
    self.assertEqual(rows['fedavg']['client_learning_rate'], '0.01')
    self.assertEqual(rows['fedavg']['server_learning_rate'], '1.0')
    self.assertEqual(rows['fedavg']['tuned_at_grid_edge'], 'client_learning_rate=smallest')
    self.assertEqual(rows['reused']['tuned_at_grid_edge'], 'client_learning_rate=smallest')
    self.assertEqual(rows['fixed']['tuned_at_grid_edge'], '')
    self.assertIn("**Warning: a searched value at its grid's edge.**", markdown)
    edge = ('client_learning_rate = 0.01 is the smallest value of its grid (0.01, 0.03, 0.1).')
    self.assertIn(f'- `fedavg`: {edge}', markdown)
    self.assertIn(f"- `reused` (values from `fedavg`'s search): {edge}", markdown)
    self.assertNotIn('- `fixed`', markdown)

  def test_no_warning_when_every_choice_is_inside_its_grid(self):
    markdown, rows = self._summarize(best_lr=0.03)
    self.assertEqual(rows['fedavg']['client_learning_rate'], '0.03')
    self.assertEqual(rows['fedavg']['tuned_at_grid_edge'], '')
    self.assertNotIn('Warning', markdown)

  def test_the_search_grid_is_a_table_with_the_choice_in_bold(self):
    markdown, _ = self._summarize(best_lr=0.03)
    self.assertIn('\n'.join([
        'Search of `fedavg`: mean validation accuracy (%) per grid point, the chosen one in bold:',
        '',
        '| client_learning_rate \\ server_learning_rate | 0.5 | 1 | 2 |',
        '|---|---|---|---|',
        '| 0.01 | 43.00 | 48.00 | 38.00 |',
        '| 0.03 | 45.00 | **50.00** | 40.00 |',
        '| 0.1 | 38.00 | 43.00 | 33.00 |']) + '\n', markdown)
    self.assertEqual(markdown.count('Search of '), 1)  # `reused` and `fixed` search nothing


class SearchTableTest(absltest.TestCase):

  def test_one_searched_flag_is_a_list_and_an_unfinished_trial_is_blank(self):
    trials = [lr_search.Trial(f'client_learning_rate={lr}', {'client_learning_rate': lr,
                                                             'server_learning_rate': 1.0},
                              {0: loss, 1: loss}, {0: loss, 1: loss})
              for lr, loss in ((0.01, 1.5), (0.1, 1.25), (1.0, None))]
    choice = lr_search.Choice(config='c', values=dict(trials[1].values),
                              trials=trials)
    self.assertEqual(summary.search_table(choice, 'loss'), [
        '| client_learning_rate | validation loss |',
        '|---|---|',
        '| 0.01 | 1.500 |',
        '| 0.1 | **1.250** |',
        '| 1 |  |'])

  def test_a_value_is_written_alike_in_the_table_and_the_choice_line(self):
    # Six significant digits: a four-digit format would write 0.0001235 here.
    choice = _choice({'client_learning_rate': (0.00012345, 0.001)},
                     {'client_learning_rate': 0.00012345})
    self.assertEqual(choice.values_text(), 'client_learning_rate=0.00012345')
    self.assertEqual(summary.search_table(choice, 'accuracy')[2:],
                     ['| 0.00012345 | **50.00** |', '| 0.001 | 50.00 |'])
    grid = _choice({'client_learning_rate': (0.00012345, 0.001), 'clip_norm': (0.00012345, 1.0)},
                   {'client_learning_rate': 0.001, 'clip_norm': 0.00012345})
    table = summary.search_table(grid, 'accuracy')
    self.assertEqual(table[0], '| client_learning_rate \\ clip_norm | 0.00012345 | 1 |')
    self.assertEqual(table[2:], ['| 0.00012345 | 50.00 | 50.00 |',
                                 '| 0.001 | **50.00** | 50.00 |'])
    self.assertEqual([lr_search.value_text(v) for v in (None, 1.0, 3, 'adam')],
                     ['', '1', '3', 'adam'])


class SearchHistoryTest(absltest.TestCase):
  """--search_history: trials of earlier sweeps outside the grid join its table, in italics."""

  _BASE = {'task': 'emnist_2nn', 'data_source': 'synthetic', 'total_rounds': 4}

  def _sweep(self, name, lrs, accuracy, base=None):
    """A sweep dir with a manifest whose search runs finished with `accuracy(lr, slr)`."""
    spec = spec_lib.from_dict({
        'name': name, 'base': base or self._BASE, 'seeds': [0],
        'configs': [{'name': 'fedavg', 'flags': {'algorithm': 'fedavg'}}],
        'lr_search': {'grid': {'client_learning_rate': lrs,
                               'server_learning_rate': [1.0, 2.0]}}})
    sweep_dir = self.create_tempdir().full_path
    manifest.write(sweep_dir, spec, default_total_rounds=1)
    runs = plan.plan_runs(spec, spec.expand(), default_total_rounds=1)
    for run in runs:
      if run.is_search and (value := accuracy(**run.trial_flags)) is not None:
        _write_run(sweep_dir, run, value, curve=False)
    return spec, sweep_dir, runs

  def test_earlier_trials_are_shown_in_italics_and_not_chosen_from(self):
    table = {(0.01, 1.0): 0.46, (0.01, 2.0): 0.90, (0.03, 1.0): 0.48, (0.03, 2.0): 0.43,
             (0.1, 1.0): 0.55, (0.1, 2.0): 0.50}
    # Its 0.003 trials never finished; its 0.03 ones are this grid's own points.
    _, first, _ = self._sweep(
        'first', [0.003, 0.01, 0.03],
        lambda client_learning_rate, server_learning_rate: None
        if client_learning_rate == 0.003 else (0.99 if client_learning_rate == 0.03 else
                                               table[client_learning_rate, server_learning_rate]))
    # Other rounds: not the same search, so its 0.3 trials are not shown.
    _, other, _ = self._sweep('other', [0.3], lambda **_: 0.95,
                              base={**self._BASE, 'total_rounds': 2})
    spec, sweep_dir, runs = self._sweep(
        'widened', [0.03, 0.1],
        lambda client_learning_rate, server_learning_rate: table[client_learning_rate,
                                                                 server_learning_rate])
    history = tuple((d, carry.planned_runs(d, flag='search_history')) for d in (other, first))
    prepared = driver.Prepared(spec, sweep_dir, spec.expand(), runs, resumed=True,
                               default_total_rounds=1, search_history=history)
    paths = driver.summarize(prepared)
    with open(paths['summary']) as f:
      markdown = f.read()
    self.assertIn('\n'.join([
        '| client_learning_rate \\ server_learning_rate | 1 | 2 |',
        '|---|---|---|',
        '| 0.01 | *46.00* | *90.00* |',
        '| 0.03 | 48.00 | 43.00 |',
        '| 0.1 | **55.00** | 50.00 |',
        '',
        'In italics: 2 trial(s) of earlier sweeps (`--search_history`) outside this grid; '
        'shown, not chosen from.']), markdown)
    rows = _csv_rows(paths['lr_search'], 'trial')
    self.assertEqual(
        {t: (r['chosen'], r['in_grid'], r['mean_validation_accuracy']) for t, r in rows.items()},
        {'client_learning_rate=0.01+server_learning_rate=1.0': ('False', 'False', '0.46'),
         'client_learning_rate=0.01+server_learning_rate=2.0': ('False', 'False', '0.9'),
         'client_learning_rate=0.03+server_learning_rate=1.0': ('False', 'True', '0.48'),
         'client_learning_rate=0.03+server_learning_rate=2.0': ('False', 'True', '0.43'),
         'client_learning_rate=0.1+server_learning_rate=1.0': ('True', 'True', '0.55'),
         'client_learning_rate=0.1+server_learning_rate=2.0': ('False', 'True', '0.5')})
    summary_row = _csv_rows(paths['summary_csv'], 'config')['fedavg']
    self.assertEqual(summary_row['client_learning_rate'], '0.1')
    # No earlier trial lies beyond these edges (lr 0.01 is below the chosen 0.1, the edge is
    # the largest), so both stay edges.
    self.assertEqual(summary_row['tuned_at_grid_edge'],
                     'client_learning_rate=largest;server_learning_rate=smallest')
    self.assertNotIn('bracketed by earlier trials', markdown)

  def test_an_edge_that_earlier_losing_trials_bracket_is_no_warning(self):
    accuracy = {0.01: 0.40, 0.03: 0.60, 0.1: 0.50}  # server lr 2 loses by 0.1 everywhere
    _, first, _ = self._sweep('first', [0.01, 0.03], lambda client_learning_rate,
                              server_learning_rate: accuracy[client_learning_rate]
                              - (server_learning_rate - 1.0) / 10)
    spec, sweep_dir, runs = self._sweep('widened', [0.03, 0.1], lambda client_learning_rate,
                                        server_learning_rate: accuracy[client_learning_rate]
                                        - (server_learning_rate - 1.0) / 10)
    history = ((first, carry.planned_runs(first, flag='search_history')),)
    prepared = driver.Prepared(spec, sweep_dir, spec.expand(), runs, resumed=True,
                               default_total_rounds=1, search_history=history)
    paths = driver.summarize(prepared)
    with open(paths['summary']) as f:
      markdown = f.read()
    self.assertIn("At this grid's edge but bracketed by earlier trials beyond it, each worse "
                  'than the choice: client_learning_rate = 0.03 (earlier: 0.01).', markdown)
    row = _csv_rows(paths['summary_csv'], 'config')['fedavg']
    self.assertEqual(row['client_learning_rate'], '0.03')
    self.assertEqual(row['tuned_at_grid_edge'], 'server_learning_rate=smallest')
    # Without the history the same grid warns about both edges.
    paths = driver.summarize(dataclasses.replace(prepared, search_history=()))
    row = _csv_rows(paths['summary_csv'], 'config')['fedavg']
    self.assertEqual(row['tuned_at_grid_edge'],
                     'client_learning_rate=smallest;server_learning_rate=smallest')

  def test_a_directory_without_a_manifest_names_the_flag(self):
    empty = self.create_tempdir().full_path
    with self.assertRaisesRegex(manifest.SweepDirError,
                                f'^--search_history={empty} holds no readable sweep.json'):
      carry.planned_runs(empty, flag='search_history')


class CpuPathTest(absltest.TestCase):

  def _summarize(self, paths):
    """Summary of 2 configs x 2 seeds whose runs started on `paths` (in plan order)."""
    by_run = dict(zip(['runs/a/seed_0', 'runs/b/seed_0', 'runs/a/seed_1', 'runs/b/seed_1'],
                      paths))
    markdown, out, runs = _summarize(self, {
        'name': 'paths',
        'base': {'task': 'emnist_2nn', 'data_source': 'synthetic', 'total_rounds': 1},
        'configs': [{'name': 'a', 'flags': {'algorithm': 'fedavg'}},
                    {'name': 'b', 'flags': {'algorithm': 'fedavg', 'client_epochs': 2}}],
        'seeds': [0, 1]}, lambda d, run: _write_run(d, run, 0.5, by_run[run.run_id]))
    self.assertCountEqual([r.run_id for r in runs], by_run)
    return markdown, _csv_rows(out['runs'], 'run')

  def test_one_path_is_recorded_and_no_note_is_written(self):
    markdown, rows = self._summarize([_PATH_A] * 4)
    self.assertEqual({row['cpu_path'] for row in rows.values()}, {_PATH_A})
    self.assertNotIn('more than one CPU path', markdown)

  def test_runs_from_two_paths_are_named_with_their_configs(self):
    markdown, rows = self._summarize([_PATH_A, _PATH_A, _PATH_B, None])
    self.assertEqual(rows['runs/a/seed_1']['cpu_path'], _PATH_B)
    self.assertEqual(rows['runs/b/seed_1']['cpu_path'], '')
    self.assertIn('**Runs from more than one CPU path.**', markdown)
    self.assertIn(f'- {_PATH_A}: 2 run(s) of `a`, `b`', markdown)
    self.assertIn(f'- {_PATH_B}: 1 run(s) of `a`', markdown)
    self.assertIn('- not recorded (a run from before the record): 1 run(s) of `b`', markdown)


class SecondMetricTest(absltest.TestCase):
  """Beside the summary metric each table gives the loss, or for the loss the accuracy."""

  def _summarize(self, metric):
    accuracies = {'runs/a/seed_0': 0.25, 'runs/a/seed_1': 0.35}  # losses 0.75, 0.65
    data = {
        'name': 'second',
        'base': {'task': 'emnist_2nn', 'data_source': 'synthetic', 'total_rounds': 1},
        'configs': [{'name': 'a', 'flags': {'algorithm': 'fedavg'}}],
        'seeds': [0, 1]}
    if metric is not None:
      data['summary'] = {'metric': metric}
    markdown, out, _ = _summarize(
        self, data, lambda d, run: _write_run(d, run, accuracies[run.run_id]))
    self.out = out
    return markdown, _csv_rows(out['summary_csv'], 'config')['a'], _csv_rows(out['runs'], 'run')

  def test_the_loss_as_summary_metric_reports_the_accuracy_beside_it(self):
    markdown, config, runs = self._summarize('loss')
    # The plots of the loss, and of the accuracy the issue asks for.
    for name in ('loss_vs_rounds', 'loss_vs_bytes', 'accuracy_vs_rounds', 'accuracy_vs_bytes'):
      self.assertTrue(os.path.getsize(self.out[name]) > 0, name)
    self.assertAlmostEqual(float(config['test_loss_mean']), 0.7)
    self.assertAlmostEqual(float(config['test_accuracy_mean']), 0.3)
    self.assertAlmostEqual(float(config['test_accuracy_std']), 0.1 / 2 ** 0.5)
    self.assertAlmostEqual(float(runs['runs/a/seed_1']['test_accuracy']), 0.35)
    self.assertIn('| test loss mean ± std | 95% CI | test accuracy (%) mean ± std | 95% CI |',
                  markdown)
    # The loss in nats with three decimals, the accuracy in points with two.
    self.assertIn('| a | 2 | 0.700 ± 0.071 | [0.065, 1.335] | 30.00 ± 7.07 | [-33.53, 93.53] |',
                  markdown)
    self.assertIn('Final test loss and accuracy:', markdown)

  def test_the_accuracy_as_summary_metric_reports_the_loss_beside_it(self):
    markdown, config, runs = self._summarize(None)
    self.assertCountEqual([k for k in self.out if k.endswith(('_vs_rounds', '_vs_bytes'))],
                          ['accuracy_vs_rounds', 'accuracy_vs_bytes'])
    self.assertAlmostEqual(float(config['test_accuracy_mean']), 0.3)
    self.assertAlmostEqual(float(config['test_loss_mean']), 0.7)
    self.assertAlmostEqual(float(runs['runs/a/seed_0']['test_loss']), 0.75)
    self.assertIn('| a | 2 | 30.00 ± 7.07 | [-33.53, 93.53] | 0.700 ± 0.071 | [0.065, 1.335] |',
                  markdown)


class SecondCurveTest(absltest.TestCase):

  def test_the_second_curve_is_averaged_over_seeds_like_the_first(self):
    def result(seed, losses, accuracies):
      return summary.RunResult(
          run_id=f'runs/a/seed_{seed}', config='a', seed=seed,
          final={'loss': losses[-1], 'accuracy': accuracies[-1]},
          rounds=np.array([0, 1, 2]), metric=np.array(losses), second=np.array(accuracies),
          cumulative_bytes=np.array([0, 10, 20]), bytes_down=10, bytes_up=10)

    config = spec_lib.Config(name='a', flags={}, own_flags={}, tune=False)
    results = [result(0, [4.0, 3.0, 2.0], [0.0, 0.1, 0.2]),
               result(1, [4.0, 2.0, 1.0], [0.0, 0.3, 0.4])]
    s = summary.summarize_config(config, [], results, metric='loss', tolerance=0.01, window=1)
    np.testing.assert_allclose(s.curve_mean, [4.0, 2.5, 1.5])
    np.testing.assert_allclose(s.second_curve_mean, [0.0, 0.2, 0.3])
    # Sample std of (0.1, 0.3) and of (0.2, 0.4): sqrt(0.1^2 + 0.1^2) = sqrt(0.02).
    np.testing.assert_allclose(s.second_curve_std, [0.0, 0.02 ** 0.5, 0.02 ** 0.5], atol=1e-12)
    self.assertEqual(s.best_round, 2)  # the lowest mean loss
    self.assertAlmostEqual(s.second.mean, 0.3)


class LocalStepsTest(absltest.TestCase):

  def test_steps_a_client_are_batches_over_clients_per_round(self):
    batches = {'runs/a/seed_0': (22, 28), 'runs/a/seed_1': (30, 30)}

    def write_run(sweep_dir, run):
      if run.config == 'b':  # a run from before the column: blank
        _write_run(sweep_dir, run, 0.5)
        return
      directory = plan.run_dir(sweep_dir, run)
      os.makedirs(directory)
      first, second = batches[run.run_id]
      with open(os.path.join(directory, 'metrics.csv'), 'w') as f:
        f.write('round_num,comm/bytes_down_per_client,comm/bytes_up_per_client,'
                'evaluation/accuracy,evaluation/loss,client_work/train/num_batches\n'
                '0,0,0,0.1,4.0,\n'
                f'1,100,50,,,{first}\n2,100,50,0.5,1.0,{second}\n')
      with open(os.path.join(directory, 'flags.json'), 'w') as f:
        json.dump({'seed': run.seed, 'clients_per_round': 10}, f)
      with open(os.path.join(directory, plan.FINISHED_FILE), 'w') as f:
        json.dump({'accuracy': 0.5, 'loss': 0.5}, f)

    markdown, out, _ = _summarize(self, {
        'name': 'steps',
        'base': {'task': 'emnist_2nn', 'data_source': 'synthetic', 'total_rounds': 2},
        'configs': [{'name': 'a', 'flags': {'algorithm': 'fedavg'}},
                    {'name': 'b', 'flags': {'algorithm': 'fedavg', 'client_epochs': 2}}],
        'seeds': [0, 1]}, write_run)
    runs = _csv_rows(out['runs'], 'run')
    self.assertAlmostEqual(float(runs['runs/a/seed_0']['local_steps_per_client']), 2.5)
    self.assertAlmostEqual(float(runs['runs/a/seed_1']['local_steps_per_client']), 3.0)
    self.assertEqual(runs['runs/b/seed_0']['local_steps_per_client'], 'nan')
    configs = _csv_rows(out['summary_csv'], 'config')
    self.assertAlmostEqual(float(configs['a']['local_steps_per_client']), 2.75)
    self.assertIn('| no | 0.0 | 2.75 |', markdown)
    self.assertIn('| no | 0.0 |  |', markdown)
    self.assertIn('Local steps a client: the batches trained', markdown)


class LogTicksTest(absltest.TestCase):
  """The bytes axis: plain numbers, and no minor labels where they would overlap."""

  def _labels(self, lo, hi):
    fig, ax = plots.plt.subplots(figsize=(7, 4.5))
    ax.plot([lo, hi], [0, 1])
    ax.set_xscale('log')
    plots._plain_log_ticks(ax.xaxis)  # pylint: disable=protected-access
    fig.canvas.draw()
    labels = {'major': [t.get_text() for t in ax.xaxis.get_majorticklabels()],
              'minor': [t.get_text() for t in ax.xaxis.get_minorticklabels()]}
    plots.plt.close(fig)
    return {kind: [text for text in texts if text] for kind, texts in labels.items()}

  def test_a_wide_axis_labels_only_the_powers_of_ten(self):
    labels = self._labels(12.0, 20000.0)  # the select Table 2 sweep's span
    self.assertEqual(labels['minor'], [])
    self.assertContainsSubset(['100', '1000', '10000'], labels['major'])

  def test_a_narrow_axis_also_labels_2_and_5(self):
    labels = self._labels(150.0, 900.0)
    self.assertEqual(labels['minor'], ['200', '500'])


if __name__ == '__main__':
  absltest.main()
