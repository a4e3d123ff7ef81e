"""Issue 17, 2026-11-25 (quiet Zen 3, no AVX-512, oneDNN off in Python, on in the worker): does a client call re-run the model's variable initializers? Empty-round time with the
model's random initializers as built vs replaced by zeros (graph-building patch)."""
import contextlib, sys, time
sys.path.insert(0, '.')  # run from the repository root
import tensorflow as tf
import tensorflow_federated as tff
from tests import testing_utils
from keras.src import backend as kb

task = testing_utils.femnist_task('emnist_cnn_gn', batch_size=20)
base_model_fn = task.baseline.model_fn

@contextlib.contextmanager
def zero_init():
  saved = {}
  for name in ('random_uniform', 'random_normal', 'truncated_normal'):
    saved[name] = getattr(kb.RandomGenerator, name)
    setattr(kb.RandomGenerator, name, lambda self, shape, *a, dtype=None, **k: tf.zeros(shape, dtype or tf.float32))
  try:
    yield
  finally:
    for name, f in saved.items():
      setattr(kb.RandomGenerator, name, f)

def zero_model_fn():
  with zero_init():
    return base_model_fn()

def build(model_fn):
  return tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.01),
      loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR)

procs = {'as_built': build(base_model_fn), 'zeros': build(zero_model_fn)}
cd = task.baseline.datasets.train_data
ids = cd.client_ids[:10]
data = [task.baseline.datasets.train_preprocess_fn(cd.create_tf_dataset_for_client(c)).take(0) for c in ids]
states = {k: p.initialize() for k, p in procs.items()}
for k, p in procs.items():
  p.next(states[k], data)
times = {k: [] for k in procs}
for r in range(8):
  for k, p in procs.items():
    t0 = time.perf_counter(); p.next(states[k], data); times[k].append(time.perf_counter() - t0)
print({k: round(sorted(v)[len(v)//2], 4) for k, v in times.items()}, {k: [round(x, 3) for x in v] for k, v in times.items()})
