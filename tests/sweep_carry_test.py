"""Tests of `tff_partial.sweep.carry` (`scripts.sweep --resume_from`) on hand-made sweep dirs.

No training: the earlier sweep's run directories are written by hand. That a
carried run trains on to the same results as a run from scratch is checked
end to end in sweep_test.py.
"""

import dataclasses
import json
import os
import shutil
import sys

from absl.testing import absltest

from tff_partial import sweep
from tff_partial.sweep import carry
from tff_partial.sweep import manifest
from tff_partial.sweep import plan
from tff_partial.sweep import spec as spec_lib
from tff_partial.training import resumable

_BASE = {'task': 'emnist_2nn', 'data_source': 'synthetic', 'total_rounds': 4,
         'client_learning_rate': 0.1}
_SPEC = {
    'name': 'earlier', 'base': _BASE,
    'configs': [{'name': 'fedavg', 'flags': {'algorithm': 'fedavg'}},
                {'name': 'fixed', 'flags': {'algorithm': 'fedavg', 'client_epochs': 2},
                 'lr_search': False}],
    'seeds': [0, 1],
    'lr_search': {'grid': {'server_learning_rate': [0.5, 1.0]}, 'flags': {'total_rounds': 2}},
}


def _runs(data):
  spec = spec_lib.from_dict(data)
  return spec, plan.plan_runs(spec, spec.expand(), default_total_rounds=100)


def _make_earlier(directory, data, started=None):
  """A sweep dir of `data` whose runs (all, or `started`) hold finished outputs."""
  spec, runs = _runs(data)
  manifest.write(directory, spec, 100)
  for run in runs:
    if started is not None and run.run_id not in started:
      continue
    run_dir = plan.run_dir(directory, run)
    os.makedirs(os.path.join(run_dir, 'checkpoints', 'program_state_4'))
    for name in ('flags.json', 'metrics.csv', 'final_eval.json', 'model_weights.npz'):
      with open(os.path.join(run_dir, name), 'w') as f:
        f.write(run.run_id)
    os.makedirs(os.path.dirname(plan.log_path(directory, run)), exist_ok=True)
    with open(plan.log_path(directory, run), 'w') as f:
      f.write('\n=== first start\n')
  return runs


def _with(data, **changes):
  out = json.loads(json.dumps(data))
  for path, value in changes.items():
    node = out
    *parents, last = path.split('__')
    for key in parents:
      node = node[key]
    node[last] = value
  return out


class PlanCopiesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    root = self.create_tempdir().full_path
    self.earlier = os.path.join(root, 'earlier')
    self.new = os.path.join(root, 'new')

  def test_more_rounds_copies_every_run_and_trains_the_final_ones_on(self):
    _make_earlier(self.earlier, _SPEC)
    _, runs = _runs(_with(_SPEC, base__total_rounds=10))
    result = carry.plan_copies(self.earlier, self.new, runs)
    self.assertEqual(result.not_copied, {})
    self.assertLen(result.copies, len(runs))  # 2 search runs + 2 configs x 2 seeds
    self.assertLen(runs, 6)
    self.assertEqual(sorted(c.run.run_id for c in result.copies if c.resume),
                     sorted(r.run_id for r in runs if not r.is_search))
    self.assertIn('6 run(s) copied (4 to train to more rounds, 2 with the same rounds; '
                  'unfinished copies resume from their checkpoints), 0 not copied',
                  carry.describe(result))

  def test_what_is_not_copied_and_why(self):
    # The earlier sweep: client lr 0.1, searches of 2 rounds, seed 1's runs not started.
    started = {r.run_id for r in _runs(_SPEC)[1] if r.seed == 0 or r.is_search}
    _make_earlier(self.earlier, _SPEC, started=started)
    # The new one: searches of 3 rounds; 'fixed' trains 2 rounds (fewer than 4).
    new = _with(_SPEC, lr_search__flags__total_rounds=3)
    new['configs'][1]['flags']['total_rounds'] = 2
    _, runs = _runs(new)
    result = carry.plan_copies(self.earlier, self.new, runs)
    self.assertEqual(result.copies, [])
    reasons = result.not_copied
    self.assertLen(reasons, 6)
    for trial in ('server_learning_rate=0.5', 'server_learning_rate=1.0'):
      self.assertIn('a search run with other flags',
                    reasons[f'lr_search/fedavg/{trial}/seed_0'])
    self.assertIn('its search (fedavg) is not copied', reasons['runs/fedavg/seed_0'])
    self.assertIn('asks for 4 rounds, more than 2', reasons['runs/fixed/seed_0'])
    self.assertEqual(reasons['runs/fedavg/seed_1'], 'the earlier sweep has not started it')

    # Other flags of a config are named.
    _, runs = _runs(_with(_SPEC, base__client_learning_rate=0.3))
    reasons = carry.plan_copies(self.earlier, self.new, runs).not_copied
    self.assertEqual(reasons['runs/fixed/seed_0'], 'other flags: --client_learning_rate')

    # A config the earlier sweep lacks.
    extra = _with(_SPEC)
    extra['configs'].append({'name': 'more', 'flags': {'client_epochs': 3},
                             'lr_search': False})
    _, runs = _runs(extra)
    reasons = carry.plan_copies(self.earlier, self.new, runs).not_copied
    self.assertEqual(reasons['runs/more/seed_0'], 'not a run of the earlier sweep')

  def test_bad_source_directories(self):
    _, runs = _runs(_SPEC)
    with self.assertRaisesRegex(manifest.SweepDirError, 'holds no readable sweep.json'):
      carry.plan_copies(self.earlier, self.new, runs)
    with self.assertRaisesRegex(manifest.SweepDirError, 'is --sweep_dir itself'):
      carry.plan_copies(self.new, self.new + '/', runs)


class CopyRunsTest(absltest.TestCase):

  def test_copies_drop_final_outputs_of_runs_that_train_on_and_never_overwrite(self):
    root = self.create_tempdir().full_path
    earlier, new = os.path.join(root, 'earlier'), os.path.join(root, 'new')
    _make_earlier(earlier, _SPEC)
    _, runs = _runs(_with(_SPEC, base__total_rounds=10))
    result = carry.plan_copies(earlier, new, runs)
    # A run the new sweep already started, and the leftover of an interrupted copy.
    kept = os.path.join(new, 'runs', 'fixed', 'seed_1')
    os.makedirs(kept)
    leftover = os.path.join(new, 'runs', 'fixed', 'seed_0.copying')
    os.makedirs(leftover)

    copied = carry.copy_runs(result, new)
    self.assertLen(copied, 5)
    self.assertNotIn('runs/fixed/seed_1', copied)
    self.assertEqual(os.listdir(kept), [])
    self.assertFalse(os.path.exists(leftover))
    final = os.path.join(new, 'runs', 'fedavg', 'seed_0')
    self.assertEqual(sorted(os.listdir(final)), ['checkpoints', 'flags.json', 'metrics.csv'])
    search = os.path.join(new, 'lr_search', 'fedavg', 'server_learning_rate=0.5', 'seed_0')
    self.assertIn('final_eval.json', os.listdir(search))
    with open(os.path.join(new, 'logs', 'runs', 'fedavg', 'seed_0.log')) as f:
      self.assertEqual(f.read(), '\n=== first start\n')
    # The earlier sweep keeps everything.
    self.assertIn('final_eval.json', os.listdir(os.path.join(earlier, 'runs', 'fedavg', 'seed_0')))
    # Again: nothing left to copy.
    self.assertEqual(carry.copy_runs(result, new), [])


class BankTest(absltest.TestCase):
  """`carry.bank_runs` (`scripts.sweep --bank_dir`) and `--resume_from` of a bank."""

  def setUp(self):
    super().setUp()
    root = self.create_tempdir().full_path
    self.earlier = os.path.join(root, 'earlier')
    self.bank = os.path.join(root, 'bank')
    self.new = os.path.join(root, 'new')
    self.spec, self.runs = _runs(_SPEC)
    _make_earlier(self.earlier, _SPEC)
    # fixed/seed_1 has not finished (checkpoints of rounds 0 and 2, a partial
    # one of round 3); fedavg/seed_0 holds a partial write a kill left.
    unfinished = os.path.join(self.earlier, 'runs', 'fixed', 'seed_1')
    os.remove(os.path.join(unfinished, 'final_eval.json'))
    os.remove(os.path.join(unfinished, 'model_weights.npz'))
    os.rmdir(os.path.join(unfinished, 'checkpoints', 'program_state_4'))
    for name in ('program_state_0', 'program_state_2', 'program_state_3_temp0007'):
      os.makedirs(os.path.join(unfinished, 'checkpoints', name))
      with open(os.path.join(unfinished, 'checkpoints', name, 'state'), 'w') as f:
        f.write(name)
    os.makedirs(os.path.join(self.earlier, 'runs', 'fedavg', 'seed_0', 'tensorboard'))
    with open(os.path.join(self.earlier, 'runs', 'fedavg', 'seed_0', 'metrics.csv_temp0042'),
              'w') as f:
      f.write('partial')

  def _bank(self, runs=None, checkpoints=False, final_checkpoints=False):
    return carry.bank_runs(self.earlier, self.bank, self.spec, 100,
                           self.runs if runs is None else runs, checkpoints=checkpoints,
                           final_checkpoints=final_checkpoints)

  def test_banks_finished_runs_without_checkpoints_weights_or_partial_writes(self):
    banked = self._bank()
    self.assertNotIn('runs/fixed/seed_1', banked)
    self.assertLen(banked, 5)  # 2 search runs, 3 of the 4 config runs
    for run_id in banked:
      self.assertEqual(sorted(os.listdir(os.path.join(self.bank, run_id))),
                       ['final_eval.json', 'flags.json', 'metrics.csv'], run_id)
      with open(os.path.join(self.bank, 'logs', run_id + '.log')) as f:
        self.assertEqual(f.read(), '\n=== first start\n')
    self.assertFalse(os.path.exists(os.path.join(self.bank, 'runs', 'fixed', 'seed_1')))
    self.assertTrue(manifest.check(self.bank, self.spec))
    self.assertEqual(manifest.read(self.bank)['default_total_rounds'], 100)
    # The sweep directory keeps everything.
    self.assertIn('checkpoints', os.listdir(os.path.join(self.earlier, 'runs', 'fedavg', 'seed_0')))

    # Once fixed/seed_1 finishes, only it is banked; banked runs are not rewritten.
    with open(os.path.join(self.earlier, 'runs', 'fixed', 'seed_1', 'final_eval.json'), 'w') as f:
      f.write('{}')
    with open(os.path.join(self.earlier, 'runs', 'fedavg', 'seed_0', 'metrics.csv'), 'w') as f:
      f.write('changed')
    self.assertEqual(self._bank(), ['runs/fixed/seed_1'])
    with open(os.path.join(self.bank, 'runs', 'fedavg', 'seed_0', 'metrics.csv')) as f:
      self.assertEqual(f.read(), 'runs/fedavg/seed_0')

  def test_unfinished_runs_are_banked_with_their_latest_checkpoint_until_they_finish(self):
    source = os.path.join(self.earlier, 'runs', 'fixed', 'seed_1')
    target = os.path.join(self.bank, 'runs', 'fixed', 'seed_1')
    self.assertLen(self._bank(checkpoints=True), 6)
    self.assertEqual(sorted(os.listdir(target)), ['checkpoints', 'flags.json', 'metrics.csv'])
    self.assertEqual(os.listdir(os.path.join(target, 'checkpoints')), ['program_state_2'])
    with open(os.path.join(target, 'checkpoints', 'program_state_2', 'state')) as f:
      self.assertEqual(f.read(), 'program_state_2')
    self.assertEqual(self._bank(checkpoints=True), [])  # no later checkpoint
    # A later checkpoint (10 > 9 > 2: by number, not by name) replaces the banked one.
    for name in ('program_state_9', 'program_state_10'):
      os.makedirs(os.path.join(source, 'checkpoints', name))
    self.assertEqual(resumable.latest_checkpoint(source), 'program_state_10')
    self.assertEqual(self._bank(checkpoints=True), ['runs/fixed/seed_1'])
    self.assertEqual(os.listdir(os.path.join(target, 'checkpoints')), ['program_state_10'])
    self.assertFalse(os.path.exists(target + '.replaced'))

    # Resumed from the bank: the copy trains on from that checkpoint.
    result = carry.plan_copies(self.bank, self.new, self.runs)
    self.assertEqual(result.not_copied, {})
    carry.copy_runs(result, self.new)
    copied = os.path.join(self.new, 'runs', 'fixed', 'seed_1')
    self.assertEqual(resumable.latest_checkpoint(copied), 'program_state_10')
    self.assertFalse(plan.is_finished(self.new, {r.run_id: r for r in self.runs}[
        'runs/fixed/seed_1']))

    # Finished: banked once more, as a finished run without checkpoints.
    with open(os.path.join(source, 'final_eval.json'), 'w') as f:
      f.write('{}')
    self.assertEqual(self._bank(), ['runs/fixed/seed_1'])
    self.assertEqual(sorted(os.listdir(target)),
                     ['final_eval.json', 'flags.json', 'metrics.csv'])
    self.assertEqual(self._bank(checkpoints=True), [])

  def test_an_unfinished_run_with_only_the_initial_checkpoint_is_not_banked(self):
    source = os.path.join(self.earlier, 'runs', 'fixed', 'seed_1', 'checkpoints')
    shutil.rmtree(os.path.join(source, 'program_state_2'))  # left: round 0 and a partial write
    banked = self._bank(checkpoints=True)
    self.assertLen(banked, 5)
    self.assertNotIn('runs/fixed/seed_1', banked)
    self.assertFalse(os.path.exists(os.path.join(self.bank, 'runs', 'fixed', 'seed_1')))
    os.makedirs(os.path.join(source, 'program_state_1'))
    self.assertEqual(self._bank(checkpoints=True), ['runs/fixed/seed_1'])
    self.assertEqual(os.listdir(os.path.join(self.bank, 'runs', 'fixed', 'seed_1', 'checkpoints')),
                     ['program_state_1'])

  def test_a_replacement_killed_between_its_renames_is_restored(self):
    self._bank(checkpoints=True)
    target = os.path.join(self.bank, 'runs', 'fixed', 'seed_1')
    os.rename(target, target + '.replaced')  # killed after the first rename
    self.assertEqual(self._bank(checkpoints=True), [])  # restored, nothing newer
    self.assertEqual(os.listdir(os.path.join(target, 'checkpoints')), ['program_state_2'])
    self.assertFalse(os.path.exists(target + '.replaced'))

  def test_finished_runs_banked_with_their_final_checkpoint_train_on_to_more_rounds(self):
    # Banked first without it (as before --bank_final_checkpoints): banked again with it.
    self.assertLen(self._bank(), 5)
    finished = os.path.join(self.earlier, 'runs', 'fedavg', 'seed_1')
    os.makedirs(os.path.join(finished, 'checkpoints', 'program_state_2'))  # an older one
    self.assertLen(self._bank(final_checkpoints=True), 5)
    for run_id in ('runs/fedavg/seed_0', 'runs/fedavg/seed_1', 'runs/fixed/seed_0'):
      self.assertEqual(sorted(os.listdir(os.path.join(self.bank, run_id))),
                       ['checkpoints', 'final_eval.json', 'flags.json', 'metrics.csv'], run_id)
      self.assertEqual(os.listdir(os.path.join(self.bank, run_id, 'checkpoints')),
                       ['program_state_4'], run_id)
    self.assertEqual(self._bank(final_checkpoints=True), [])  # once only
    self.assertFalse(os.path.exists(os.path.join(self.bank, 'runs', 'fixed', 'seed_1')))

    # Resumed from the bank with more rounds: the finished runs train on.
    _, more = _runs(_with(_SPEC, base__total_rounds=10))
    result = carry.plan_copies(self.bank, self.new, more)
    self.assertEqual(result.not_copied,
                     {'runs/fixed/seed_1': 'the earlier sweep has not started it'})
    resumed = sorted(c.run.run_id for c in result.copies if c.resume)
    self.assertEqual(resumed, ['runs/fedavg/seed_0', 'runs/fedavg/seed_1', 'runs/fixed/seed_0'])
    carry.copy_runs(result, self.new)
    copied = os.path.join(self.new, 'runs', 'fedavg', 'seed_1')
    self.assertEqual(sorted(os.listdir(copied)), ['checkpoints', 'flags.json', 'metrics.csv'])
    self.assertEqual(resumable.latest_checkpoint(copied), 'program_state_4')

  def test_bad_bank_directories(self):
    with self.assertRaisesRegex(manifest.SweepDirError, 'is --sweep_dir itself'):
      carry.bank_runs(self.earlier, self.earlier + '/', self.spec, 100, self.runs)
    other = spec_lib.from_dict(_with(_SPEC, base__client_learning_rate=0.3))
    manifest.write(self.bank, other, 100)
    with self.assertRaisesRegex(manifest.SweepDirError,
                                f'--bank_dir={self.bank} belongs to sweep .earlier. with another '
                                'spec'):
      self._bank()
    self.assertFalse(os.path.exists(os.path.join(self.bank, 'runs')))

  def test_resume_from_a_bank_copies_finished_runs_and_cannot_train_them_on(self):
    self._bank()
    result = carry.plan_copies(self.bank, self.new, self.runs)
    self.assertEqual(sorted(c.run.run_id for c in result.copies),
                     sorted(r.run_id for r in self.runs if r.run_id != 'runs/fixed/seed_1'))
    self.assertFalse(any(c.resume for c in result.copies))
    self.assertEqual(result.not_copied,
                     {'runs/fixed/seed_1': 'the earlier sweep has not started it'})
    self.assertLen(carry.copy_runs(result, self.new), 5)
    by_id = {r.run_id: r for r in self.runs}
    self.assertTrue(plan.is_finished(self.new, by_id['runs/fedavg/seed_1']))
    self.assertFalse(plan.is_finished(self.new, by_id['runs/fixed/seed_1']))

    # More rounds: the banked runs have no checkpoint to train on from.
    _, more = _runs(_with(_SPEC, base__total_rounds=10))
    result = carry.plan_copies(self.bank, self.new, more)
    self.assertEqual(sorted(c.run.run_id for c in result.copies),
                     sorted(r.run_id for r in more if r.is_search))
    self.assertEqual(result.not_copied['runs/fedavg/seed_0'],
                     'the earlier run trained 4 rounds and has no checkpoints (a bank without '
                     '--bank_final_checkpoints) to train '
                     'on to 10')


# A stand-in for scripts.train (no TensorFlow): writes the run's flags and a
# final evaluation whose accuracy depends on --server_learning_rate only, and
# appends to trained.txt, so a test sees which runs trained.
_FAKE_TRAIN = r"""
import json, os, sys
flags = {}
for arg in sys.argv[1:]:
  key, _, value = arg[2:].partition('=')
  try:
    flags[key] = json.loads(value)
  except ValueError:
    flags[key] = value
run_dir = os.path.join(flags.pop('root_output_dir'), flags.pop('experiment_name'))
os.makedirs(run_dir, exist_ok=True)
with open(os.path.join(run_dir, 'flags.json'), 'w') as f:
  json.dump(flags, f)
score = {0.5: 0.3, 1.0: 0.5, 2.0: 0.4, 4.0: 0.9}[flags.get('server_learning_rate', 1.0)]
with open(os.path.join(run_dir, 'metrics.csv'), 'w') as f:
  f.write('round_num,comm/bytes_down_per_client,comm/bytes_up_per_client,'
          'evaluation/accuracy,evaluation/loss\n')
  f.write(f'1,8,4,{score},1.0\n')
with open(os.path.join(run_dir, 'final_eval.json'), 'w') as f:
  json.dump({'accuracy': score, 'loss': 1.0}, f)
with open(os.path.join(os.path.dirname(sys.argv[0]), 'trained.txt'), 'a') as f:
  f.write(run_dir + '\n')
"""


class ExtendedSearchGridTest(absltest.TestCase):
  """A search grid extended past its edge: finished runs are kept if the choice stands."""

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    tools = self.create_tempdir().full_path
    self.script = os.path.join(tools, 'fake_train.py')
    with open(self.script, 'w') as f:
      f.write(_FAKE_TRAIN)
    self.trained_file = os.path.join(tools, 'trained.txt')
    self.train = sweep.TrainInterface(
        command=[sys.executable, self.script],
        check_fn=lambda argvs: ([None] * len(argvs), 4))

  def _trained(self):
    if not os.path.exists(self.trained_file):
      return []
    with open(self.trained_file) as f:
      return [line.strip() for line in f]

  def _log_tail(self, directory, run):
    try:
      with open(plan.log_path(directory, run)) as f:
        return f.read()[-2000:]
    except OSError as e:
      return str(e)

  def _sweep(self, name, grid, resume_from=None, print_fn=lambda _: None, search_only=False,
             data=None, bank_dir=None):
    data = _with(data or _SPEC, name=name, lr_search__grid__server_learning_rate=grid)
    directory = os.path.join(self.root, name)
    prepared = sweep.prepare(spec_lib.from_dict(data), directory, self.train,
                             resume_from=resume_from)
    if os.path.exists(self.trained_file):
      os.remove(self.trained_file)
    report, _ = sweep.run(prepared, self.train, parallel=2, print_fn=print_fn,
                          summary_dir=os.path.join(self.root, name + '_summary'),
                          interactive=False, search_only=search_only, bank_dir=bank_dir)
    # A run that failed says why here (its log), not as a missing run below.
    failed = {r.run_id: (report.reasons.get(r.run_id), self._log_tail(directory, r))
              for r in prepared.runs if report.states.get(r.run_id) in ('failed', 'skipped')}
    self.assertEmpty(failed)
    trained = sorted(os.path.relpath(path, directory) for path in self._trained())
    return prepared, report, trained

  def test_runs_are_copied_when_the_search_chooses_their_values_again(self):
    _, _, trained = self._sweep('earlier', [0.5, 1.0])
    self.assertLen(trained, 6)  # 2 search runs, 2 configs x 2 seeds

    # 2.0 scores below 1.0: the search chooses 1.0 again.
    prepared, report, trained = self._sweep(
        'wider', [0.5, 1.0, 2.0], resume_from=os.path.join(self.root, 'earlier'))
    self.assertEqual(sorted(prepared.carry.if_same_choice),
                     ['runs/fedavg/seed_0', 'runs/fedavg/seed_1'])
    self.assertIn('4 run(s) copied (0 to train to more rounds, 4 with the same rounds; '
                  'unfinished copies resume from their checkpoints), 1 not copied, '
                  '2 copied if their search chooses as before', carry.describe(prepared.carry))
    self.assertEqual(trained, ['lr_search/fedavg/server_learning_rate=2.0/seed_0'])
    self.assertEqual(report.states['runs/fedavg/seed_0'], 'finished_before')
    self.assertIn('its search chose the same values', report.reasons['runs/fedavg/seed_0'])
    with open(os.path.join(self.root, 'wider', 'runs', 'fedavg', 'seed_1', 'flags.json')) as f:
      self.assertEqual(json.load(f)['server_learning_rate'], 1.0)

    # 4.0 scores above 1.0: the config's runs train from scratch with 4.0.
    _, report, trained = self._sweep(
        'other', [0.5, 1.0, 4.0], resume_from=os.path.join(self.root, 'earlier'))
    self.assertEqual(trained, ['lr_search/fedavg/server_learning_rate=4.0/seed_0',
                               'runs/fedavg/seed_0', 'runs/fedavg/seed_1'])
    self.assertEqual(report.states['runs/fedavg/seed_0'], 'done')
    with open(os.path.join(self.root, 'other', 'runs', 'fedavg', 'seed_1', 'flags.json')) as f:
      self.assertEqual(json.load(f)['server_learning_rate'], 4.0)

  def test_runs_trained_at_a_pinned_rate_are_copied_when_the_search_chooses_it(self):
    # The earlier sweep trained fedavg at a fixed server lr 1.0, no search.
    pinned = _with(_SPEC)
    pinned['configs'][0] = {'name': 'fedavg', 'lr_search': False,
                            'flags': {'algorithm': 'fedavg', 'server_learning_rate': 1.0}}
    _, _, trained = self._sweep('pinned', [0.5], data=pinned)
    self.assertEqual(trained, ['runs/fedavg/seed_0', 'runs/fedavg/seed_1',
                               'runs/fixed/seed_0', 'runs/fixed/seed_1'])

    # Searched now; 1.0 scores best of 0.5 / 1.0 / 2.0: its runs are copied, not trained.
    prepared, report, trained = self._sweep(
        'searched', [0.5, 1.0, 2.0], resume_from=os.path.join(self.root, 'pinned'))
    self.assertEqual(sorted(prepared.carry.if_same_choice),
                     ['runs/fedavg/seed_0', 'runs/fedavg/seed_1'])
    self.assertIn('trained at fixed --server_learning_rate, which the search (fedavg) now '
                  'chooses', prepared.carry.not_copied['runs/fedavg/seed_0'])
    self.assertEqual(trained, [f'lr_search/fedavg/server_learning_rate={v}/seed_0'
                               for v in ('0.5', '1.0', '2.0')])
    self.assertEqual(report.states['runs/fedavg/seed_1'], 'finished_before')

    # 4.0 scores best: the runs at 1.0 are not copied; they train with 4.0.
    _, _, trained = self._sweep(
        'searched_other', [1.0, 4.0], resume_from=os.path.join(self.root, 'pinned'))
    self.assertEqual(trained[-2:], ['runs/fedavg/seed_0', 'runs/fedavg/seed_1'])
    with open(os.path.join(self.root, 'searched_other', 'runs', 'fedavg', 'seed_0',
                           'flags.json')) as f:
      self.assertEqual(json.load(f)['server_learning_rate'], 4.0)

    # A pinned flag the search does not choose still stops the copy.
    _, runs = _runs(_with(_SPEC, name='searched', base__client_learning_rate=0.3))
    reasons = carry.plan_copies(os.path.join(self.root, 'pinned'), self.create_tempdir().full_path,
                                runs).not_copied
    self.assertEqual(reasons['runs/fedavg/seed_0'],
                     'other flags: --client_learning_rate, --server_learning_rate')

  def test_a_rerun_without_resume_from_still_copies_the_runs_waiting_for_their_search(self):
    # Stopped after its searches, rerun without --resume_from: the manifest
    # recorded it, so the full runs are copied once the search chooses their
    # values again, not trained from scratch.
    self._sweep('earlier', [0.5, 1.0])
    earlier = os.path.join(self.root, 'earlier')
    _, _, trained = self._sweep('wider', [0.5, 1.0, 2.0], resume_from=earlier, search_only=True)
    self.assertEqual(trained, ['lr_search/fedavg/server_learning_rate=2.0/seed_0'])
    self.assertFalse(os.path.exists(os.path.join(self.root, 'wider', 'runs', 'fedavg')))
    with open(os.path.join(self.root, 'wider', manifest.MANIFEST_FILE)) as f:
      self.assertEqual(json.load(f)['resume_from'], os.path.abspath(earlier))
    printed = []
    prepared, report, trained = self._sweep('wider', [0.5, 1.0, 2.0], print_fn=printed.append)
    self.assertEqual(trained, [])
    self.assertEqual(report.states['runs/fedavg/seed_1'], 'finished_before')
    self.assertEqual(prepared.carry.source_dir, os.path.abspath(earlier))
    self.assertIn(f'--resume_from={os.path.abspath(earlier)}: from the sweep manifest '
                  '(the sweep started from it)', printed)

    # The earlier directory gone: said, and the waiting runs train.
    os.rename(earlier, earlier + '_moved')
    wider = os.path.join(self.root, 'wider')
    shutil.rmtree(os.path.join(wider, 'runs', 'fedavg'))
    printed = []
    prepared, report, trained = self._sweep('wider', [0.5, 1.0, 2.0], print_fn=printed.append)
    self.assertIsNone(prepared.carry)
    self.assertEqual(trained, ['runs/fedavg/seed_0', 'runs/fedavg/seed_1'])
    self.assertIn(f'this sweep started from --resume_from={os.path.abspath(earlier)}, which is '
                  'gone: runs not copied yet train from scratch', printed)

  def test_a_banked_sweep_resumes_in_a_fresh_directory_without_training_again(self):
    bank = os.path.join(self.root, 'bank')
    printed = []
    self._sweep('earlier', [0.5, 1.0], search_only=True, bank_dir=bank, print_fn=printed.append)
    self.assertIn(f'--bank_dir={bank}: 0 finished run(s) banked now; the others are banked as '
                  'they finish', printed)
    self.assertLen(os.listdir(os.path.join(bank, 'lr_search', 'fedavg')), 2)  # as each finished
    self.assertFalse(os.path.exists(os.path.join(bank, 'runs')))
    _, _, trained = self._sweep('earlier', [0.5, 1.0], bank_dir=bank)
    self.assertLen(trained, 4)  # the 2 configs x 2 seeds; the searches had finished
    self.assertLen(os.listdir(os.path.join(bank, 'runs', 'fedavg')), 2)

    # A fresh checkout: the sweep directory gone, the bank committed.
    shutil.rmtree(os.path.join(self.root, 'earlier'))
    prepared, report, trained = self._sweep('earlier', [0.5, 1.0], resume_from=bank)
    self.assertEqual(trained, [])
    self.assertEqual(set(report.states.values()), {'finished_before'})
    with open(os.path.join(self.root, 'earlier_summary', 'runs.csv')) as f:
      runs_csv = f.read()
    self.assertIn('runs/fedavg/seed_1', runs_csv)
    # The bank is itself a sweep directory of the spec: its summary is the same.
    summary_dir = os.path.join(self.root, 'bank_summary')
    sweep.summarize(dataclasses.replace(prepared, sweep_dir=bank), summary_dir=summary_dir)
    with open(os.path.join(summary_dir, 'runs.csv')) as f:
      self.assertEqual(f.read(), runs_csv)

    # A bank of another spec stops the sweep before it writes anything.
    with self.assertRaisesRegex(sweep.SweepDirError, '--bank_dir=.* belongs to sweep'):
      self._sweep('other', [0.5], bank_dir=bank)
    self.assertFalse(os.path.exists(os.path.join(self.root, 'other', manifest.MANIFEST_FILE)))

  def test_a_bank_of_a_widened_search_still_copies_the_runs_waiting_for_their_search(self):
    # A bank records the sweep's --resume_from, relative to itself: resumed
    # from the bank in a fresh checkout, the full runs that wait for their
    # search are copied from the earlier bank once it chooses as before.
    earlier_bank = os.path.join(self.root, 'earlier_bank')
    wider_bank = os.path.join(self.root, 'wider_bank')
    self._sweep('earlier', [0.5, 1.0], bank_dir=earlier_bank)
    _, _, trained = self._sweep('wider', [0.5, 1.0, 2.0], resume_from=earlier_bank,
                                search_only=True, bank_dir=wider_bank)
    self.assertEqual(trained, ['lr_search/fedavg/server_learning_rate=2.0/seed_0'])
    with open(os.path.join(wider_bank, manifest.MANIFEST_FILE)) as f:
      self.assertEqual(json.load(f)['resume_from'], os.path.join('..', 'earlier_bank'))

    # A fresh checkout: the sweep directories gone, the banks committed.
    shutil.rmtree(os.path.join(self.root, 'earlier'))
    shutil.rmtree(os.path.join(self.root, 'wider'))
    prepared, report, trained = self._sweep('wider', [0.5, 1.0, 2.0], resume_from=wider_bank)
    self.assertEqual(trained, [])
    self.assertIn(f'--resume_from={wider_bank} (and from {earlier_bank}, which it started '
                  'from): 5 run(s) copied (0 to train to more rounds, 5 with the same rounds; '
                  'unfinished copies resume from their checkpoints), 0 not copied, 2 copied if '
                  'their search chooses as before', carry.describe(prepared.carry))
    self.assertEqual(report.states['runs/fedavg/seed_0'], 'finished_before')
    self.assertIn(f'copied from {earlier_bank}: its search chose the same values',
                  report.reasons['runs/fedavg/seed_0'])  # named by the bank it came from
    by_id = {r.run_id: r for r in prepared.runs}
    for run_id in ('runs/fedavg/seed_1', 'runs/fixed/seed_1'):  # with their logs
      self.assertTrue(os.path.exists(plan.log_path(os.path.join(self.root, 'wider'),
                                                   by_id[run_id])))

    # A loop of records, or the new sweep's own directory, ends the chain.
    path = os.path.join(earlier_bank, manifest.MANIFEST_FILE)
    with open(path) as f:
      record = json.load(f)
    with open(path, 'w') as f:
      json.dump(dict(record, resume_from=os.path.join('..', 'wider_bank')), f)
    self.assertEqual(carry._source_chain(wider_bank, self.root), [wider_bank, earlier_bank])
    self.assertEqual(carry._source_chain(wider_bank, earlier_bank), [wider_bank])

  def test_the_choice_and_an_edge_warning_are_printed_before_the_full_runs_train(self):
    printed = []  # (line, how many search runs / fedavg runs had trained then)

    def counts():
      trained = [os.path.relpath(p, os.path.join(self.root, 'edge')) for p in self._trained()]
      return (sum(p.startswith('lr_search/fedavg/') for p in trained),
              sum(p.startswith('runs/fedavg/') for p in trained))

    self._sweep('edge', [0.5, 1.0], print_fn=lambda line: printed.append((line, counts())))
    choice = 'the search of fedavg chose server_learning_rate=1 (validation accuracy 0.5000'
    warning = ("warning: the search of fedavg chose a value at its grid's edge: "
               'server_learning_rate = 1 is the largest value of its grid (0.5, 1); widen the grid')
    for text in (choice, warning):
      when = [trained for line, trained in printed if line.startswith(text)]
      # Once as fedavg's first full run starts (both its search runs trained,
      # none of its full runs yet), once more at the end (all trained). The
      # `fixed` config's runs need no search: with 2 runs at a time they may
      # train before or between, so they are not counted.
      self.assertEqual(when, [(2, 0), (2, 2)], text)


class ExtendsTest(absltest.TestCase):

  def test_extends_merges_base_and_replaces_other_keys(self):
    root = self.create_tempdir().full_path
    os.makedirs(os.path.join(root, 'sub'))
    with open(os.path.join(root, 'earlier.json'), 'w') as f:
      json.dump(_SPEC, f)
    child = {'extends': '../earlier.json', 'name': 'longer', 'base': {'total_rounds': 10},
             'seeds': [0, 1, 2]}
    with open(os.path.join(root, 'sub', 'longer.json'), 'w') as f:
      json.dump(child, f)
    loaded = spec_lib.load_spec(os.path.join(root, 'sub', 'longer.json'))
    whole = _with(_SPEC, name='longer', base__total_rounds=10, seeds=[0, 1, 2])
    self.assertEqual(loaded, whole)
    self.assertEqual(spec_lib.from_dict(loaded).digest(), spec_lib.from_dict(whole).digest())

    with open(os.path.join(root, 'loop.json'), 'w') as f:
      json.dump({'extends': 'loop.json', 'name': 'loop'}, f)
    with self.assertRaisesRegex(spec_lib.SpecError, '"extends" makes a cycle'):
      spec_lib.load_spec(os.path.join(root, 'loop.json'))
    with open(os.path.join(root, 'missing.json'), 'w') as f:
      json.dump({'extends': 'nope.json', 'name': 'x'}, f)
    with self.assertRaisesRegex(spec_lib.SpecError, 'nope.json is not a file'):
      spec_lib.load_spec(os.path.join(root, 'missing.json'))

  def _load_child(self, child):
    root = self.create_tempdir().full_path
    with open(os.path.join(root, 'earlier.json'), 'w') as f:
      json.dump(_SPEC, f)
    with open(os.path.join(root, 'child.json'), 'w') as f:
      json.dump({'extends': 'earlier.json', 'name': 'child', **child}, f)
    return spec_lib.load_spec(os.path.join(root, 'child.json'))

  def test_update_and_drop_configs_by_name(self):
    loaded = self._load_child({
        'drop_configs': ['fedavg'],
        'update_configs': [{'name': 'fixed', 'flags': {'client_epochs': 3, 'algorithm': None,
                                                       'client_batch_size': 4},
                            'lr_search': None, 'grid': {'clients_per_round': [2, 3]}}]})
    # Written out whole by hand: the same dict, hence the same digest.
    whole = _with(_SPEC, name='child', configs=[
        {'name': 'fixed', 'flags': {'client_epochs': 3, 'client_batch_size': 4},
         'grid': {'clients_per_round': [2, 3]}}])
    self.assertEqual(loaded, whole)
    self.assertEqual(spec_lib.from_dict(loaded).digest(), spec_lib.from_dict(whole).digest())
    # The parent's order is kept; an update of the flags alone keeps the other keys.
    loaded = self._load_child({'update_configs': [
        {'name': 'fixed', 'flags': {'client_epochs': 5}}, {'name': 'fedavg', 'lr_from': 'fixed'}]})
    self.assertEqual(loaded['configs'], [
        {'name': 'fedavg', 'flags': {'algorithm': 'fedavg'}, 'lr_from': 'fixed'},
        {'name': 'fixed', 'flags': {'algorithm': 'fedavg', 'client_epochs': 5}, 'lr_search': False}])

  def test_add_configs_appends_new_configs_after_the_parents(self):
    new = {'name': 'fedpt', 'flags': {'algorithm': 'fedpt', 'frozen_layers': ['dense1']},
           'lr_from': 'fedavg'}
    loaded = self._load_child({'drop_configs': ['fixed'], 'add_configs': [new]})
    whole = _with(_SPEC, name='child', configs=[_SPEC['configs'][0], new])
    self.assertEqual(loaded, whole)
    self.assertEqual(spec_lib.from_dict(loaded).digest(), spec_lib.from_dict(whole).digest())
    # Without drops the parent's configs come first, in their order.
    self.assertEqual([c['name'] for c in self._load_child({'add_configs': [new]})['configs']],
                     ['fedavg', 'fixed', 'fedpt'])

  def test_configs_that_share_a_name_are_all_kept_updated_and_dropped(self):
    # As in fedpt_table1_cifar10_1500: one method at two rates, each with its own grid.
    twins = [{'name': 'fedpt', 'flags': {'algorithm': 'fedpt', 'client_learning_rate': 0.03},
              'grid': {'frozen_target_trainable_fraction': [0.26]}, 'lr_search': False},
             {'name': 'fedpt', 'flags': {'algorithm': 'fedpt', 'client_learning_rate': 1.0},
              'grid': {'frozen_target_trainable_fraction': [0.02]}, 'lr_search': False}]
    root = self.create_tempdir().full_path
    with open(os.path.join(root, 'twins.json'), 'w') as f:
      json.dump(_with(_SPEC, name='twins', configs=twins), f)

    def load(child):
      with open(os.path.join(root, 'child.json'), 'w') as f:
        json.dump({'extends': 'twins.json', 'name': 'child', **child}, f)
      return spec_lib.load_spec(os.path.join(root, 'child.json'))

    fedavg = {'name': 'fedavg', 'flags': {'algorithm': 'fedavg'}, 'lr_search': False}
    loaded = load({'add_configs': [fedavg]})
    self.assertEqual(loaded['configs'], twins + [fedavg])
    self.assertLen(spec_lib.from_dict(loaded).expand(), 3)
    self.assertEqual([c['flags']['client_epochs'] for c in load(
        {'update_configs': [{'name': 'fedpt', 'flags': {'client_epochs': 2}}]})['configs']], [2, 2])
    self.assertEqual(load({'drop_configs': ['fedpt'], 'add_configs': [fedavg]})['configs'],
                     [fedavg])

  def test_bad_update_or_drop_configs_name_the_valid_configs(self):
    cases = [
        ({'drop_configs': ['fedpt']}, r"no config 'fedpt' in the parent spec; its configs: fedavg, fixed"),
        ({'update_configs': [{'name': 'nope', 'flags': {}}]}, r"no config 'nope' .*fedavg, fixed"),
        ({'drop_configs': ['fixed'], 'update_configs': [{'name': 'fixed', 'lr_from': 'fedavg'}]},
         "'fixed' is both updated and dropped"),
        ({'drop_configs': ['fixed'], 'configs': []}, 'either "configs" .* or "update_configs"'),
        ({'drop_configs': 'fixed'}, '"drop_configs" must be a list of config names'),
        ({'update_configs': [{'flags': {}}]}, '"update_configs" must be a list of objects'),
        ({'add_configs': [{'name': 'fixed', 'flags': {}}]},
         '"add_configs": the parent spec already has a config \'fixed\''),
        ({'add_configs': {'name': 'x'}}, '"add_configs" must be a list of configs'),
        ({'add_configs': [{'name': 'x'}], 'configs': []}, 'either "configs" .* "add_configs"'),
    ]
    for child, message in cases:
      with self.subTest(message):
        with self.assertRaisesRegex(spec_lib.SpecError, message):
          self._load_child(child)
    path = os.path.join(self.create_tempdir().full_path, 'alone.json')
    with open(path, 'w') as f:
      json.dump({'name': 'alone', 'drop_configs': ['fedavg']}, f)
    with self.assertRaisesRegex(spec_lib.SpecError, 'this spec extends none'):
      spec_lib.load_spec(path)
    with open(path, 'w') as f:
      json.dump({'name': 'alone', 'add_configs': [{'name': 'x'}]}, f)
    with self.assertRaisesRegex(spec_lib.SpecError, 'this spec extends none'):
      spec_lib.load_spec(path)


if __name__ == '__main__':
  absltest.main()
