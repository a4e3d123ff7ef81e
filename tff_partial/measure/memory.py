"""Client peak memory of local training, for PVT's Table 2 comparison.

Yang et al., *Partial Variable Training for Efficient On-Device Federated
Learning* (PVT), Table 2 / Table 4: the peak memory of forward passes alone
("FProp") against that of training all variables (AVT) or a subset (PVT); the
"extra memory for training" is the difference. PVT saves it because a frozen
variable's gradient is never formed and the activations only its gradient
needs are not kept for the backward pass.

What is measured: the peak bytes held by TensorFlow's CPU allocator
(`tf.config.experimental.get_memory_info('CPU:0')['peak']` after
`reset_memory_stats`, minus the bytes in use before) during one run of one
step on one batch, plus the bytes resident before it (model variables and the
batch), in a fresh Python subprocess per measurement. This counts every tensor
TensorFlow allocates on the host for the step (activations, the tensors kept
for the backward pass, gradients, kernel temporaries), not the Python
interpreter or the TF runtime. The step:

* forward: `loss(y, model(x, training=True))`;
* train: the same, the gradients (`tf.gradients`) of the trained variables
  only (`trainable_mask`, default all), then an SGD update of them: what a
  client that knows its mask runs (all gradients formed, then applied).

The same step gives the same figure on any x86-64 CPU, with oneDNN on or off
in the caller, run after run. Measured here (tests/memory_test.py, notes in
docs/pvt.md): TF's default runtime gives a different peak in every fresh
process (the default CPU allocator keeps no statistics; with the BFC allocator
the peak moved by up to 45% between processes: tensors of the batch built
from NumPy alias its buffer or not depending on its alignment, independent ops
run in an order that depends on thread timing, and grappler rewrites; oneDNN
kernels allocate outside TF's allocator, so a matmul's peak read 0). So the
subprocess pins everything that can move:

* `TF_ENABLE_ONEDNN_OPTS=0` and `TF_CPU_ALLOCATOR_USE_BFC=true`: TF's own
  (Eigen) kernels, whose tensors and temporaries all come from the BFC
  allocator, which keeps statistics;
* the step is built in a `tf.Graph` with the batch as constants, pruned to
  what the step needs, and chained by control dependencies in creation order,
  then run in a session with one inter-op and one intra-op thread and
  grappler off: one fixed execution order, tensors freed after their last
  use. Creation order runs the whole forward pass, then every gradient, then
  the updates, as a client step does.

Independent cross-check (`kept_bytes`, `gradient_bytes`): read from the same
graph, the bytes of the forward tensors the backward pass consumes and of the
gradients; tests/memory_test.py asserts that training's extra memory agrees
with their sum (dense layers; convolutions add Eigen's im2col temporaries,
which only the allocator sees).

TFF has no client memory measurement; this is written here.
"""

import contextlib
import multiprocessing
import os
import pickle
import queue as queue_lib
import threading
import time
from typing import Callable, Optional, Sequence

import numpy as np

_MODES = ('forward', 'train')

# The measuring subprocess's environment (see the module docstring).
CHILD_ENV = {
    'TF_ENABLE_ONEDNN_OPTS': '0',
    'TF_CPU_ALLOCATOR_USE_BFC': 'true',
    'TF_CPP_MIN_LOG_LEVEL': '2',
    'PYTHONHASHSEED': '0',
}
_ENV_LOCK = threading.Lock()
# Ops whose output is a view of their first input (no new buffer).
_ALIAS_OPS = frozenset({'Identity', 'Reshape', 'Squeeze', 'ExpandDims', 'StopGradient',
                        'PreventGradient', 'EnsureShape', 'Snapshot'})
# Ops whose output lives outside the step (variables, the batch, constants).
_RESIDENT_OPS = frozenset({'Const', 'ReadVariableOp', 'VarHandleOp', 'Placeholder'})
_GRADIENT_SCOPE = 'gradients/'
# Elementwise ops whose kernels write into an input buffer at its last use.
_FORWARDING_OPS = frozenset({
    'Relu', 'ReluGrad', 'Relu6', 'Relu6Grad', 'Elu', 'EluGrad', 'Selu', 'SeluGrad',
    'BiasAdd', 'Add', 'AddV2', 'Sub', 'Mul', 'RealDiv', 'DivNoNan', 'Maximum',
    'Minimum', 'Neg', 'Square', 'Sqrt', 'Rsqrt', 'Exp', 'Log', 'Tanh', 'Sigmoid',
    'TanhGrad', 'SigmoidGrad', 'SquaredDifference', 'Softmax', 'LogSoftmax'})


def _tensor_bytes(tensor) -> int:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if tensor.dtype in (tf.resource, tf.variant, tf.string) or not tensor.shape.is_fully_defined():
    return 0
  return int(np.prod(tensor.shape.as_list(), dtype=np.int64)) * tensor.dtype.size


def kept_for_backward_bytes(step_ops) -> int:
  """Bytes of the forward tensors that the step's gradient ops consume.

  `step_ops`: the ops of one training step in creation order, gradient ops
  under the `gradients/` name scope (`tf.gradients`). Views (`_ALIAS_OPS`)
  count as the tensor they view; variables, the batch and constants as 0.
  """
  owner = {}
  for op in step_ops:
    for i, t in enumerate(op.outputs):
      if op.type in _ALIAS_OPS and op.inputs:
        owner[t.name] = owner.get(op.inputs[0].name)
      elif op.type == 'IdentityN':
        owner[t.name] = owner.get(op.inputs[i].name)
      elif op.type in _RESIDENT_OPS:
        owner[t.name] = None
      else:
        owner[t.name] = t
  kept = {}
  for op in step_ops:
    if op.name.startswith(_GRADIENT_SCOPE):
      for t in op.inputs:
        if not t.op.name.startswith(_GRADIENT_SCOPE) and owner.get(t.name) is not None:
          kept[owner[t.name].name] = _tensor_bytes(owner[t.name])
  return int(sum(kept.values()))


def graph_step_peak(ops) -> int:
  """Peak bytes of live step tensors when `ops` run in this order (graph count).

  Read from the graph's static shapes: each op's outputs are allocated when it
  runs and freed after their last consumer in `ops` ran. Views
  (`_ALIAS_OPS`) share their input's buffer; variables, the batch and
  constants (`_RESIDENT_OPS`) count 0; an elementwise op (`_FORWARDING_OPS`)
  writes into an input of its output's shape and type at that input's last
  use, as TF's kernels do (`forward_input_or_allocate_output`). Kernel
  temporaries (e.g. Eigen's im2col buffers of convolution gradients) are not
  seen.
  """
  names = {op.name for op in ops}
  uses = {}  # buffer (the tensor that allocated it) -> consumers left
  owner = {}  # tensor -> its buffer, None when resident
  consumers = {}
  for op in ops:
    for t in op.inputs:
      consumers[t.name] = consumers.get(t.name, 0) + 1
  live = peak = 0
  size = {}
  for op in ops:
    inputs = [t for t in op.inputs if t.op.name in names]
    created = []
    for i, t in enumerate(op.outputs):
      view = None
      if op.type in _ALIAS_OPS and op.inputs:
        view = op.inputs[0]
      elif op.type == 'IdentityN':
        view = op.inputs[i]
      if view is not None:
        buffer = owner.get(view.name)
      elif op.type in _RESIDENT_OPS:
        buffer = None
      else:
        buffer = None
        if op.type in _FORWARDING_OPS:
          for inp in inputs:
            b = owner.get(inp.name)
            if (b is not None and uses[b] == 1 and inp.dtype == t.dtype
                and inp.shape.is_fully_defined() and inp.shape == t.shape):
              buffer = b  # reused in place
              break
        if buffer is None:
          buffer = t.name
          size[buffer] = _tensor_bytes(t)
          uses[buffer] = 0
          created.append(buffer)
          live += size[buffer]
      owner[t.name] = buffer
      if buffer is not None:
        uses[buffer] += consumers.get(t.name, 0)
    peak = max(peak, live)
    for t in inputs:
      b = owner.get(t.name)
      if b is not None:
        uses[b] -= 1
        if uses[b] == 0:
          live -= size[b]
    for b in created:
      if uses[b] == 0:
        live -= size[b]
  return int(peak)


def _needed_nodes(graph_def, fetch: str) -> set:
  """Names of the nodes `fetch` depends on (data and control inputs)."""
  inputs = {n.name: [i.lstrip('^').split(':')[0] for i in n.input] for n in graph_def.node}
  needed, todo = set(), [fetch]
  while todo:
    name = todo.pop()
    if name not in needed:
      needed.add(name)
      todo.extend(inputs[name])
  return needed


def _build_step(tf, keras_model_fn, loss_fn, input_shape, input_dtype, label_shape,
                num_classes, batch_size, trainable_mask, mode, seed):
  """(graph_def, init op name, step op name, info) of the sequential step."""
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(seed)
    model = keras_model_fn()
    loss = loss_fn()
    variables = model.trainable_weights
    mask = [True] * len(variables) if trainable_mask is None else [bool(m) for m in trainable_mask]
    if len(mask) != len(variables):
      raise ValueError(
          f'trainable_mask has {len(mask)} entries; the model has '
          f'{len(variables)} trainable variables')
    trained = [v for v, m in zip(variables, mask) if m]
    rng = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(input_dtype), np.integer):
      x = rng.integers(0, num_classes, size=[batch_size, *input_shape])
    else:
      x = rng.uniform(size=[batch_size, *input_shape])
    y = rng.integers(0, num_classes, size=[batch_size, *label_shape])
    x = tf.constant(x.astype(input_dtype), name='batch_x')
    y = tf.constant(y.astype(np.int32), name='batch_y')
    init = tf.compat.v1.global_variables_initializer()
    first = len(graph.get_operations())
    value = loss(y, model(x, training=True))
    gradient_bytes = 0
    if mode == 'train':
      pairs = [(v, g) for v, g in zip(trained, tf.gradients(value, trained)) if g is not None]
      gradient_bytes = sum(_tensor_bytes(g) for _, g in pairs)
      step = tf.group([v.assign_sub(0.01 * g) for v, g in pairs], name='client_step')
    else:
      step = tf.identity(value, name='client_step').op
    step_ops = graph.get_operations()[first:]
    info = dict(
        weights_bytes=int(sum(np.prod(v.shape) * v.dtype.size for v in model.weights)),
        trained_bytes=int(sum(np.prod(v.shape) * v.dtype.size for v in trained))
        if mode == 'train' else 0,
        batch_bytes=int(x.dtype.size * np.prod(x.shape) + y.dtype.size * np.prod(y.shape)),
        kept_bytes=kept_for_backward_bytes(step_ops) if mode == 'train' else 0,
        gradient_bytes=int(gradient_bytes))
  graph_def = graph.as_graph_def()
  # One fixed order: each op the step needs waits for the one created before it.
  needed = _needed_nodes(graph_def, step.name)
  step_names = {op.name for op in step_ops} & needed
  info['graph_step_peak'] = graph_step_peak([op for op in step_ops if op.name in step_names])
  previous = None
  for node in graph_def.node:  # creation order
    if node.name in step_names:
      if previous is not None:
        node.input.append('^' + previous)
      previous = node.name
  return graph_def, init.name, step.name, info


def _child(result_queue, keras_model_fn, loss_fn, input_shape, input_dtype,
           label_shape, num_classes, batch_size, trainable_mask, mode, seed):
  """Runs in the fresh subprocess: one step, reports allocator bytes."""
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.set_visible_devices([], 'GPU')  # host memory only
    graph_def, init, step, info = _build_step(
        tf, keras_model_fn, loss_fn, input_shape, input_dtype, label_shape,
        num_classes, batch_size, trainable_mask, mode, seed)
    graph = tf.Graph()
    with graph.as_default():
      tf.graph_util.import_graph_def(graph_def, name='')
    config = tf.compat.v1.ConfigProto(
        inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    with tf.compat.v1.Session(graph=graph, config=config) as session:
      session.run(init)
      session.run(step)  # creates the kernels (and their constants) before measuring
      before = tf.config.experimental.get_memory_info('CPU:0')['current']
      tf.config.experimental.reset_memory_stats('CPU:0')
      session.run(step)
      step_peak = tf.config.experimental.get_memory_info('CPU:0')['peak'] - before
    resident = info['weights_bytes'] + info['batch_bytes']
    result_queue.put(dict(peak=int(resident + step_peak), step_peak=int(step_peak),
                          resident_bytes=int(resident), **info))
  except Exception as e:  # pylint: disable=broad-except  (reported to parent)
    result_queue.put(dict(error=f'{type(e).__name__}: {e}'))


@contextlib.contextmanager
def temporary_environ(env: dict):
  """`os.environ` updated with `env` inside the block, restored after.

  For a subprocess that must inherit the variables (this module's child, a
  TFF worker); serialized by a lock, since os.environ is process-wide.
  """
  with _ENV_LOCK:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
      yield
    finally:
      for k, v in saved.items():
        if v is None:
          os.environ.pop(k, None)
        else:
          os.environ[k] = v


def _child_environment():
  """os.environ as the spawned subprocess must inherit it (restored after)."""
  return temporary_environ(CHILD_ENV)


def measure_step_peak(
    keras_model_fn: Callable,
    loss_fn: Callable,
    input_shape: Sequence[int],
    batch_size: int,
    *,
    mode: str = 'train',
    trainable_mask: Optional[Sequence[bool]] = None,
    input_dtype: str = 'float32',
    label_shape: Sequence[int] = (),
    num_classes: int = 2,
    seed: int = 0,
    timeout_s: float = 600.0,
) -> dict:
  """Peak bytes of one `mode` step (see the module docstring), in a fresh subprocess.

  Returns dict(peak: resident + step_peak, step_peak: allocator peak above
  what was resident, resident_bytes: weights + batch, weights_bytes,
  trained_bytes, batch_bytes, kept_bytes, gradient_bytes (train only)).
  """
  if mode not in _MODES:
    raise ValueError(f'mode={mode!r}; valid values: {", ".join(_MODES)}')
  if batch_size <= 0:
    raise ValueError(f'batch_size={batch_size} must be a positive integer')
  args = (keras_model_fn, loss_fn, tuple(input_shape), input_dtype,
          tuple(label_shape), int(num_classes), int(batch_size),
          None if trainable_mask is None else [bool(m) for m in trainable_mask],
          mode, int(seed))
  try:
    pickle.dumps(args)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        'keras_model_fn and loss_fn must be picklable (module-level functions or '
        f'functools.partial of them) to run in a fresh subprocess: {e}') from e
  context = multiprocessing.get_context('spawn')
  result_queue = context.Queue()
  process = context.Process(target=_child, args=(result_queue, *args))
  with _child_environment():
    process.start()
  deadline = time.monotonic() + timeout_s
  result = None
  try:
    while result is None:
      try:
        result = result_queue.get(timeout=1.0)
      except queue_lib.Empty:
        if not process.is_alive():
          try:  # it may have put its result just before exiting
            result = result_queue.get(timeout=5.0)
            break
          except queue_lib.Empty:
            pass
          raise RuntimeError(
              f'the memory measurement subprocess exited with code '
              f'{process.exitcode} without a result (killed, e.g. out of memory?)'
          ) from None
        if time.monotonic() > deadline:
          process.kill()
          raise RuntimeError(
              f'memory measurement did not finish in {timeout_s} s') from None
  finally:
    process.join(timeout=60)
  if 'error' in result:
    raise ValueError(f'memory measurement failed in the subprocess: {result["error"]}')
  return result


def client_training_peak(
    keras_model_fn: Callable,
    loss_fn: Callable,
    input_shape: Sequence[int],
    batch_size: int,
    trainable_mask: Optional[Sequence[bool]] = None,
    **kwargs,
) -> dict:
  """Forward-only and training peak bytes of one client step, and their gap.

  Args:
    keras_model_fn: picklable no-arg callable returning a Keras model.
    loss_fn: picklable no-arg callable returning a Keras loss taking
      (labels int32, model output).
    input_shape: shape of one example (without the batch dimension).
    batch_size: examples per step.
    trainable_mask: one bool per `model.trainable_weights` (PVT's mask); None
      trains all variables (AVT).
    **kwargs: `input_dtype`, `label_shape`, `num_classes`, `seed`,
      `timeout_s` of `measure_step_peak`.

  Returns:
    dict(forward_peak, train_peak, extra = train_peak - forward_peak,
    weights_bytes, trained_bytes, kept_bytes, gradient_bytes), all in bytes.
  """
  forward = measure_step_peak(keras_model_fn, loss_fn, input_shape, batch_size,
                              mode='forward', **kwargs)
  train = measure_step_peak(keras_model_fn, loss_fn, input_shape, batch_size,
                            mode='train', trainable_mask=trainable_mask, **kwargs)
  return dict(
      forward_peak=forward['peak'],
      train_peak=train['peak'],
      extra=train['peak'] - forward['peak'],
      weights_bytes=train['weights_bytes'],
      trained_bytes=train['trained_bytes'],
      kept_bytes=train['kept_bytes'],
      gradient_bytes=train['gradient_bytes'],
  )
