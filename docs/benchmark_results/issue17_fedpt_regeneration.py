"""Cost of regenerating FedPT's frozen block kernels (ResNet-18-GN w64, blocks 1-4) from a seed.

One client's regeneration per round, in a tf.function, 1 thread, warm, median of 5.

    PYTHONPATH=. python docs/benchmark_results/issue17_fedpt_regeneration.py
"""
import re, time, numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1); tf.config.threading.set_inter_op_parallelism_threads(1)
from tasks import cifar10
from tff_partial.frozen import regeneration as R
m = cifar10.create_resnet18_gn(64)
paths = R.weight_paths(m)
frozen = []
for layer in m.layers:
  if re.fullmatch(r'block[1-4][ab]_conv[12]', layer.name):
    for w in [layer.kernel]:
      init = R.initializer_of(layer, 'kernel', paths[id(w)])
      frozen.append(R.describe_variable(paths[id(w)], w, init))
n = sum(v.num_params for v in frozen)
f = tf.function(lambda s: R.regenerate(frozen, s))
s = tf.constant([1, 2], tf.int32)
f(s)
ts=[]
for _ in range(5):
  t=time.perf_counter(); out=f(s); _=[o.numpy() for o in out[:1]]; ts.append(time.perf_counter()-t)
print(f'{len(frozen)} frozen kernels, {n:,} params: regenerate median {np.median(ts):.3f} s (1 thread)')

# The raw generators for 11M values, same thread setting.
s = tf.constant([1,2]); shape=[11_000_000]
fs={'stateless_uniform': tf.function(lambda: tf.random.stateless_uniform(shape, s)),
    'stateless_normal': tf.function(lambda: tf.random.stateless_normal(shape, s)),
    'stateless_truncated_normal': tf.function(lambda: tf.random.stateless_truncated_normal(shape, s))}
for k,f in fs.items():
  f(); ts=[]
  for _ in range(5):
    t=time.perf_counter(); f().numpy(); ts.append(time.perf_counter()-t)
  print(k, f'{np.median(ts):.3f} s')
