"""Smoke test of scripts.plot on a hand-made participants CSV."""

import os
import shutil
import tempfile

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver

from scripts import plot

FLAGS = flags.FLAGS

_CSV = """participant,split,num_train,num_test,federated,local,finetune,freeze_base,ewc,distill
p1,test_split,10,3,0.5,0.25,0.75,0.5,0.5,0.5
p2,test_split,12,4,0.25,0.5,0.25,0.25,0.75,0.5
p3,in_order,8,2,0.5,0.5,1.0,0.5,0.5,1.0
p4,test_split,20,5,0.2,0.6,0.2,0.4,0.4,0.5
"""
_PNG = b'\x89PNG\r\n\x1a\n'


class PlotTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    if not FLAGS.is_parsed():
      FLAGS.mark_as_parsed()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
    self.csv = os.path.join(self.dir, 'participants.csv')
    with open(self.csv, 'w') as f:
      f.write(_CSV)

  def test_main_writes_three_pngs(self):
    out = os.path.join(self.dir, 'plots')
    with flagsaver.flagsaver(csv=self.csv, output_dir=out, plot_title='test'):
      plot.main(['plot'])
    for name in ('federated_vs_local.png', 'adapted_minus_local.png',
                 'adapted_minus_federated.png'):
      path = os.path.join(out, name)
      with open(path, 'rb') as f:
        self.assertEqual(f.read(8), _PNG)
      self.assertGreater(os.path.getsize(path), 5000)

  def test_missing_csv_is_a_usage_error(self):
    with flagsaver.flagsaver(csv=os.path.join(self.dir, 'nope.csv')):
      with self.assertRaisesRegex(Exception, '--csv'):
        plot.main(['plot'])


if __name__ == '__main__':
  absltest.main()
