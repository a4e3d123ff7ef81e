"""Tests of `tff_partial.sweep.lr_search`: which choices sit at their grid's edge.

No training: the search runs' `final_eval.json` files are written by hand.
That the search trains on the validation split and the chosen values reach
the configs' runs is checked end to end in sweep_test.py.
"""

import csv
import json
import os

from absl.testing import absltest

from tff_partial.sweep import driver
from tff_partial.sweep import lr_search
from tff_partial.sweep import plan
from tff_partial.sweep import spec as spec_lib


def _choice(grid, chosen):
  """A Choice over every combination of `grid` (flag -> values) that chose `chosen`."""
  trials = [lr_search.Trial(name, values, {0: 0.5}, {0: 1.0})
            for name, values in spec_lib.LrSearch(grid=grid).trials()]
  return lr_search.Choice(config='c', values=chosen, score=0.5, trials=trials)


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


def _write_final_eval(sweep_dir, run, accuracy):
  directory = plan.run_dir(sweep_dir, run)
  os.makedirs(directory)
  with open(os.path.join(directory, plan.FINISHED_FILE), 'w') as f:
    json.dump({'accuracy': accuracy, 'loss': 1.0 - accuracy}, f)


class SummaryWarnsTest(absltest.TestCase):
  """summary.md and summary.csv name the configs whose searched values sit at an edge."""

  def _summarize(self, best_lr):
    spec = spec_lib.from_dict({
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
    })
    sweep_dir = self.create_tempdir().full_path
    configs = spec.expand()
    runs = plan.plan_runs(spec, configs, default_total_rounds=4)
    for run in runs:
      if run.is_search:  # best: best_lr with server lr 1.0
        flags = run.trial_flags
        accuracy = 0.5 - abs(flags['client_learning_rate'] - best_lr) - abs(
            flags['server_learning_rate'] - 1.0) / 10
        _write_final_eval(sweep_dir, run, accuracy)
    prepared = driver.Prepared(spec, sweep_dir, configs, runs, resumed=False,
                               default_total_rounds=4)
    paths = driver.summarize(prepared)
    with open(paths['summary']) as f:
      markdown = f.read()
    with open(paths['summary_csv']) as f:
      rows = {row['config']: row for row in csv.DictReader(f)}
    return markdown, rows

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


if __name__ == '__main__':
  absltest.main()
