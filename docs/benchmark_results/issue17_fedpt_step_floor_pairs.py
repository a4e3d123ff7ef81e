"""FedPT's step floor with two clients at once (issue 17, 2026-11-26, Zen 5).

The same 10 steps of batch 20 on the full ResNet-18-GN as
`issue17_fedpt_step_floor.py`, but as the package's local worker runs clients
(`--local_client_parallelism=auto` on 2 cores): two models trained at once on
two Python threads, one intra-op thread. Prints the median of 5 over each
configuration alone and two at once. Output on the Zen 5, oneDNN on:
`issue17_fedpt_step_floor_pairs_zen5_dnn1.txt`.

    PYTHONPATH=. python docs/benchmark_results/issue17_fedpt_step_floor_pairs.py
"""
import re, sys, time, threading
import numpy as np
import tensorflow as tf
from tasks import cifar10
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
rng = np.random.default_rng(0)
x = tf.constant(rng.normal(size=(20, 24, 24, 3)).astype(np.float32))
y = tf.constant(rng.integers(0, 10, size=(20,)).astype(np.int32))
PAT = {'fedavg': None, 'blocks34': r'block[34][ab]_conv[12]/kernel', 'blocks1234': r'block[1-4][ab]_conv[12]/kernel'}
def make(model, pat):
  vs = [v for v in model.trainable_variables if pat is None or not re.search(pat, v.name)]
  @tf.function
  def steps():
    for _ in tf.range(10):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
      grads = tape.gradient(loss, vs)
      for v, g in zip(vs, grads):
        v.assign_sub(0.01 * g)
    return loss
  return steps
models = [cifar10.create_resnet18_gn(64) for _ in range(2)]
fns = {k: [make(m, p) for m in models] for k, p in PAT.items()}
for k in fns:
  for f in fns[k]: f()
def timed(f):
  t = time.perf_counter(); f(); return time.perf_counter() - t
res = {k: {'alone': [], 'pair': []} for k in fns}
for rep in range(5):
  for k, (f0, f1) in fns.items():
    res[k]['alone'].append(timed(f0))
    out = [0, 0]
    def run(i, f):
      out[i] = timed(f)
    t = time.perf_counter()
    th = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate((f0, f1))]
    [a.start() for a in th]; [a.join() for a in th]
    res[k]['pair'].append(time.perf_counter() - t)
for k, r in res.items():
  a, p = np.median(r['alone']), np.median(r['pair'])
  print(f"{k}: alone {a:.3f} s / 10 steps, two at once {p:.3f} s (slowdown {p/a:.2f}x); vs fedavg alone {a/np.median(res['fedavg']['alone']):.3f}, pair {p/np.median(res['fedavg']['pair']):.3f}", flush=True)
