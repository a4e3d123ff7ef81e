"""Tests of tff_partial.adaptation.summary on a hand-made CSV (exact numbers)."""

import os
import shutil
import tempfile

from absl.testing import absltest

from tff_partial.adaptation import summary

# 5 participants. federated < local: p2, p4 (2 of 5). Best strategy per
# participant (first in column order on ties): p1 finetune, p2 ewc,
# p3 finetune (tie with distill), p4 distill, p5 freeze_base.
_CSV = """participant,split,num_train,num_test,federated,local,finetune,freeze_base,ewc,distill
p1,test_split,10,3,0.5,0.25,0.75,0.5,0.5,0.5
p2,test_split,12,4,0.25,0.5,0.25,0.25,0.75,0.5
p3,in_order,8,2,0.5,0.5,1.0,0.5,0.5,1.0
p4,test_split,20,5,0.2,0.6,0.2,0.4,0.4,0.5
p5,test_split,9,3,0.75,0.5,0.5,1.0,0.25,0.75
"""


class SummaryTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
    self.path = os.path.join(self.dir, 'p.csv')
    with open(self.path, 'w') as f:
      f.write(_CSV)

  def test_read_csv(self):
    rows, names = summary.read_csv(self.path)
    self.assertEqual(names, ['finetune', 'freeze_base', 'ewc', 'distill'])
    self.assertLen(rows, 5)
    self.assertEqual(rows[2]['participant'], 'p3')
    self.assertEqual(rows[2]['num_train'], 8)
    self.assertEqual(rows[3]['local'], 0.6)

  def test_summary_counts(self):
    rows, names = summary.read_csv(self.path)
    s = summary.summarize(rows, names)
    self.assertEqual(s['num_participants'], 5)
    self.assertEqual(s['federated_below_local'], {'count': 2, 'share': 0.4})
    below_local = s['adapted_below_local']
    self.assertEqual(below_local['finetune'], {'count': 2, 'share': 0.4})  # p2 p4 (p5 ties)
    self.assertEqual(below_local['freeze_base']['count'], 2)  # p2 p4
    self.assertEqual(below_local['ewc']['count'], 2)  # p4 p5
    self.assertEqual(below_local['distill']['count'], 1)  # p4
    self.assertEqual(below_local['best_adapted'], {'count': 1, 'share': 0.2})  # p4
    below_fed = s['adapted_below_federated']
    self.assertEqual(below_fed['finetune']['count'], 1)  # p5
    self.assertEqual(below_fed['ewc']['count'], 1)  # p5 (p1 and p3 tie)
    self.assertEqual(below_fed['best_adapted']['count'], 0)
    vs_fed = s['adapted_vs_federated']
    # finetune vs federated: p1 .75>.5, p2 tie, p3 1.0>.5, p4 tie, p5 .5<.75.
    self.assertEqual(vs_fed['finetune']['helped'], {'count': 2, 'share': 0.4})
    self.assertEqual(vs_fed['finetune']['unchanged'], {'count': 2, 'share': 0.4})
    self.assertEqual(vs_fed['finetune']['hurt'], {'count': 1, 'share': 0.2})
    # best adapted: .75 .75 1.0 .5 1.0 vs .5 .25 .5 .2 .75: all helped.
    self.assertEqual(vs_fed['best_adapted']['helped']['count'], 5)
    self.assertEqual(vs_fed['best_adapted']['hurt']['count'], 0)
    self.assertEqual(s['best_strategy_counts'],
                     {'finetune': 2, 'freeze_base': 1, 'ewc': 1, 'distill': 1})
    self.assertEqual(s['best_strategy_ties'], 1)
    # Best adapted: .75 .75 1.0 .5 1.0 > max(fed, local) for all but p4.
    self.assertEqual(s['best_adapted_above_both'], {'count': 4, 'share': 0.8})

  def test_summary_means_and_medians(self):
    rows, names = summary.read_csv(self.path)
    acc = summary.summarize(rows, names)['accuracy']
    self.assertAlmostEqual(acc['federated']['mean'], 0.44)
    self.assertAlmostEqual(acc['federated']['median'], 0.5)
    self.assertAlmostEqual(acc['local']['mean'], 0.47)
    self.assertAlmostEqual(acc['local']['median'], 0.5)
    self.assertAlmostEqual(acc['finetune']['mean'], 0.54)
    self.assertAlmostEqual(acc['best_adapted']['mean'], 0.8)
    self.assertAlmostEqual(acc['best_adapted']['median'], 0.75)
    table = summary.format_table(summary.summarize(rows, names))
    self.assertIn('5 participants', table)
    self.assertIn('federated', table)

  def test_write_read_roundtrip(self):
    rows, names = summary.read_csv(self.path)
    columns = ['participant', 'split', 'num_train', 'num_test', 'federated',
               'local', *names]
    out = os.path.join(self.dir, 'out.csv')
    summary.write_csv(out, rows, columns)
    again, again_names = summary.read_csv(out)
    self.assertEqual(again_names, names)
    self.assertEqual([dict(r) for r in again], [dict(r) for r in rows])

  def test_bad_input(self):
    with self.assertRaisesRegex(ValueError, 'no participants'):
      summary.summarize([], ['finetune'])
    bad = os.path.join(self.dir, 'bad.csv')
    with open(bad, 'w') as f:
      f.write('participant,federated\np1,0.5\n')
    with self.assertRaisesRegex(ValueError, 'local'):
      summary.read_csv(bad)


if __name__ == '__main__':
  absltest.main()
