"""Pure training-step cost: all variables vs FedPT's trainable subset (ResNet-18-GN w64).

Batch 20, 24x24x3, 10 steps per timing, warm, tf.function, one process; 2 threads
(the cores) and 1 thread. Prints per-config median seconds over 7 repetitions.
The floor of FedPT's saving: only the weight gradients of frozen kernels are
skipped; the backward pass still runs to the stem, whose conv is trainable.

    PYTHONPATH=. python docs/benchmark_results/issue17_fedpt_step_floor.py [threads]
"""
import re, sys, time
import numpy as np
import tensorflow as tf
from tasks import cifar10

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(threads)
model = cifar10.create_resnet18_gn(64)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = tf.keras.optimizers.SGD(0.01)
rng = np.random.default_rng(0)
x = tf.constant(rng.normal(size=(20, 24, 24, 3)).astype(np.float32))
y = tf.constant(rng.integers(0, 10, size=(20,)).astype(np.int32))

def make(variables):
  @tf.function
  def steps():
    for _ in tf.range(10):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
      grads = tape.gradient(loss, variables)
      for v, g in zip(variables, grads):
        v.assign_sub(0.01 * g)
    return loss
  return steps

allv = model.trainable_variables
configs = {
  'fedavg': allv,
  'blocks34': [v for v in allv if not re.search(r'block[34][ab]_conv[12]/kernel', v.name)],
  'blocks1234': [v for v in allv if not re.search(r'block[1-4][ab]_conv[12]/kernel', v.name)],
  'forward_only': None,
}
fns = {}
for k, vs in configs.items():
  if vs is None:
    fns[k] = tf.function(lambda: tf.reduce_sum(model(x, training=True)))
  else:
    fns[k] = make(vs)
  fns[k]()
times = {k: [] for k in fns}
for rep in range(7):
  for k, f in fns.items():
    t = time.perf_counter(); f(); 
    if k == 'forward_only':
      for _ in range(9): f()
    times[k].append(time.perf_counter() - t)
for k, ts in times.items():
  n = sum(int(np.prod(v.shape)) for v in configs[k]) if configs[k] is not None else 0
  print(f'{k}: median {np.median(ts):.3f} s per 10 steps (vs fedavg {np.median(ts)/np.median(times["fedavg"]):.3f}), trainable {n:,}', flush=True)
