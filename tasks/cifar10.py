"""CIFAR-10 split over clients by Dirichlet(alpha) over labels; ResNet-18-GN.

FedPT (Sidahmed et al.), appendix: "We randomly partition the training data
into 500 clients, each receiving 100 examples" with label skew drawn from a
symmetric Dirichlet (Hsu et al. 2019; alpha = 1), preprocessing of Reddi et al.
2020 (random crop + horizontal flip for training, central crop for test,
normalized pixels), and ResNet-18 with GroupNorm in place of BatchNorm
(Hsieh et al. 2020). FedPT freezes "the convolutional layers of the residual
blocks in increasing order": the block convolutions are named
`block1a_conv1, block1a_conv2, block1b_conv1, ..., block4b_conv2` (shortcut
1x1 convolutions `block{2,3,4}a_shortcut_conv`, GroupNorm layers `*_gn*`), so
`--frozen_layers` can name them block by block.

Data, in DESIGN.md order: Keras' CIFAR-10 (`tf.keras.datasets.cifar10`, from
`~/.keras/datasets` or downloaded when online); a directory (or .tar.xz) of
JPEG class folders `train/<class>/*.jpg`, `test/<class>/*.jpg`
(`--data_source=jpeg --data_dir=...`), decoded once and cached as .npy; random
images only with `--data_source=synthetic`.

Test clients: the test set is split the same way (Dirichlet(alpha), same
examples per client, `len(test) // examples_per_client` clients, seed derived
from `--seed`), so per-client evaluation sees the same kind of skew; the
centralized evaluation uses every test example.

`--cifar10_split`: `label_skew` (default, the above: each client's label
distribution ~ Dirichlet(alpha * prior), Hsu et al. 2019, as FedPT uses it;
every client has exactly `examples_per_client` examples) or `per_class` (Yu,
Bagdasaryan, Shmatikov 2020, sec. 4.2: each class's images are allocated to
the clients by Dirichlet(alpha, ..., alpha); clients differ in size,
`examples_per_client` is their mean; the authors' code uses alpha 0.9 over
100 participants). At the same alpha, `per_class` is far less skewed: alpha 0.9
over 100 clients of the whole training set gives clients whose largest class
is on average 30% of their images (166-971 images each), `label_skew` 64-71%.
"""

import collections
import functools
import glob
import hashlib
import os
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import data_utils
from tasks import partition
from tasks import registry

NUM_CLASSES = 10
# Keras' label order (alphabetical, as the JPEG class folders sort).
CLASS_NAMES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog',
               'horse', 'ship', 'truck')
IMAGE_SHAPE = (32, 32, 3)


# ----------------------------------------------------------------------------
# Model.
def _conv(filters, kernel, stride, name):
  return tf.keras.layers.Conv2D(
      filters, kernel, strides=stride, padding='same', use_bias=False,
      kernel_initializer='he_normal', name=name)


def _gn(groups, name):
  return tf.keras.layers.GroupNormalization(groups=groups, epsilon=1e-5, name=name)


def _basic_block(x, filters, stride, groups, name):
  """ResNet basic block (two 3x3 convs), GroupNorm after each conv."""
  shortcut = x
  y = _conv(filters, 3, stride, f'{name}_conv1')(x)
  y = _gn(groups, f'{name}_gn1')(y)
  y = tf.keras.layers.ReLU(name=f'{name}_relu1')(y)
  y = _conv(filters, 3, 1, f'{name}_conv2')(y)
  y = _gn(groups, f'{name}_gn2')(y)
  if stride != 1 or x.shape[-1] != filters:
    shortcut = _conv(filters, 1, stride, f'{name}_shortcut_conv')(x)
    shortcut = _gn(groups, f'{name}_shortcut_gn')(shortcut)
  y = tf.keras.layers.Add(name=f'{name}_add')([y, shortcut])
  return tf.keras.layers.ReLU(name=f'{name}_relu2')(y)


def create_resnet18_gn(width: int = 64, num_classes: int = NUM_CLASSES,
                       image_size: int = 24, gn_groups: int = 2) -> tf.keras.Model:
  """ResNet-18 for CIFAR (3x3 stem, no max-pool) with GroupNorm.

  Stages of widths (w, 2w, 4w, 8w), two basic blocks each; width 64 is the
  standard ResNet-18 (11,173,962 parameters with 10 classes).
  """
  if width < 1 or width % gn_groups:
    raise registry.TaskError(
        f'--cifar10_width={width} must be a positive multiple of '
        f'--cifar10_gn_groups={gn_groups}')
  inputs = tf.keras.layers.Input(shape=(image_size, image_size, 3), name='image')
  x = _conv(width, 3, 1, 'conv1')(inputs)
  x = _gn(gn_groups, 'conv1_gn')(x)
  x = tf.keras.layers.ReLU(name='conv1_relu')(x)
  for stage, mult in enumerate((1, 2, 4, 8), start=1):
    for block in ('a', 'b'):
      stride = 2 if (stage > 1 and block == 'a') else 1
      x = _basic_block(x, width * mult, stride, gn_groups, f'block{stage}{block}')
  x = tf.keras.layers.GlobalAveragePooling2D(name='pool')(x)
  outputs = tf.keras.layers.Dense(num_classes, name='dense')(x)
  return tf.keras.Model(inputs, outputs, name='resnet18_gn')


def block_conv_names() -> list[str]:
  """Residual-block conv layer names in freezing order (FedPT table 10)."""
  return [f'block{s}{b}_conv{i}' for s in range(1, 5) for b in 'ab' for i in (1, 2)]


def _loss():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _metrics():
  return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]


# ----------------------------------------------------------------------------
# Data.
def _npy_cache_dir(root: str, cache_dir: Optional[str]) -> str:
  stat = os.stat(root)
  key = hashlib.sha256(f'{os.path.abspath(root)}:{stat.st_mtime_ns}'.encode()).hexdigest()[:12]
  return os.path.join(cache_dir or data_utils.default_cache_dir(), f'cifar10_npy-{key}')


def _decode_split(root: str, split: str, data_dir: str):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  images, labels = [], []
  for label, name in enumerate(CLASS_NAMES):
    files = sorted(glob.glob(os.path.join(root, split, name, '*.jp*g')))
    if not files:
      raise registry.TaskError(
          f'--data_dir={data_dir!r}: no {split}/{name}/*.jpg files (expected '
          'JPEG class folders train/<class>/*.jpg and test/<class>/*.jpg with '
          f'classes {", ".join(CLASS_NAMES)})')
    for path in files:
      with Image.open(path) as im:
        array = np.asarray(im.convert('RGB'), dtype=np.uint8)
      if array.shape != IMAGE_SHAPE:
        raise registry.TaskError(
            f'--data_dir={data_dir!r}: {path} has shape {array.shape}, expected {IMAGE_SHAPE}')
      images.append(array)
    labels.append(np.full(len(files), label, dtype=np.int64))
  return np.stack(images), np.concatenate(labels)


def load_jpeg_cifar10(data_dir: str, cache_dir: Optional[str] = None):
  """(x_train, y_train, x_test, y_test) from JPEG class folders or their archive.

  JPEGs are decoded once (PIL) and cached as .npy under the cache dir, keyed
  by the directory, so later loads take a second instead of decoding 60k files.
  """
  root = data_utils.unpack_if_archive(
      data_dir, cache_dir, flag='--data_dir', must_contain=('train', 'test'))
  npy_dir = _npy_cache_dir(root, cache_dir)
  names = ('x_train', 'y_train', 'x_test', 'y_test')
  paths = [os.path.join(npy_dir, f'{n}.npy') for n in names]
  if all(os.path.exists(p) for p in paths):
    return tuple(np.load(p) for p in paths)
  arrays = (*_decode_split(root, 'train', data_dir), *_decode_split(root, 'test', data_dir))
  os.makedirs(npy_dir, exist_ok=True)
  for path, array in zip(paths, arrays):
    tmp = f'{path}.tmp{os.getpid()}.npy'
    np.save(tmp, array)
    os.replace(tmp, path)  # atomic: concurrent loaders never see half a file
  return arrays


def _load_keras_cifar10():
  (x_train, y_train), (x_test, y_test) = tf.keras.datasets.cifar10.load_data()
  return (x_train, y_train.reshape(-1).astype(np.int64),
          x_test, y_test.reshape(-1).astype(np.int64))


def _synthetic_cifar10(num_train: int, num_test: int, seed: int):
  rng = np.random.default_rng([seed, 10])
  return (rng.integers(0, 256, (num_train, *IMAGE_SHAPE), dtype=np.uint8),
          np.arange(num_train, dtype=np.int64) % NUM_CLASSES,
          rng.integers(0, 256, (num_test, *IMAGE_SHAPE), dtype=np.uint8),
          np.arange(num_test, dtype=np.int64) % NUM_CLASSES)


def load_cifar10(data_source: str, data_dir: Optional[str], cache_dir: Optional[str],
                 num_synthetic: int = 1000, seed: int = 0):
  """(x_train, y_train, x_test, y_test, source); never silently synthetic."""
  if data_source == 'synthetic':
    return (*_synthetic_cifar10(num_synthetic, 1000, seed), 'synthetic')
  if data_source == 'jpeg' or (data_source == 'auto' and data_dir):
    if not data_dir:
      raise registry.TaskError(
          '--data_source=jpeg needs --data_dir (a directory or .tar.xz of JPEG '
          'class folders train/<class>/*.jpg, test/<class>/*.jpg)')
    return (*load_jpeg_cifar10(data_dir, cache_dir), 'jpeg')
  try:
    return (*_load_keras_cifar10(), 'tff')
  except Exception as e:  # pylint: disable=broad-except  (network errors vary)
    raise registry.TaskError(
        'CIFAR-10 could not be loaded with tf.keras.datasets.cifar10.load_data '
        f'(not in ~/.keras/datasets and no download: {type(e).__name__}). Point '
        'at local data with --data_source=jpeg --data_dir=<JPEG class folders '
        'or .tar.xz> (e.g. ../shared/data/cifar10_jpg.tar.xz), or use '
        '--data_source=synthetic for a smoke test.') from e


SPLITS = ('label_skew', 'per_class')


def federate(x, y, *, num_clients, examples_per_client, alpha, seed, prefix,
             split='label_skew'):
  """In-memory `ClientData` of a Dirichlet(alpha) split of (x, y) (`SPLITS`)."""
  if split == 'per_class':
    splits = partition.dirichlet_class_split(
        y, num_clients, alpha, seed, num_classes=NUM_CLASSES,
        num_examples=num_clients * examples_per_client)
  else:
    splits = partition.dirichlet_label_split(
        y, num_clients, examples_per_client, alpha, seed, num_classes=NUM_CLASSES)
  width = len(str(num_clients - 1))
  per_client = collections.OrderedDict(
      (f'{prefix}{i:0{width}d}', collections.OrderedDict(image=x[idx], label=y[idx]))
      for i, idx in enumerate(splits))
  return data_utils.client_data_from_arrays(per_client)


def create_preprocess_fn(spec: tff.simulation.baselines.ClientSpec, *, crop_size: int,
                         distort: bool, mean: np.ndarray, std: np.ndarray):
  """Crop (random + flip when `distort`, else central), per-channel normalize, batch.

  The order of shuffle / repeat / take / map / batch is that of TFF's
  `baselines.cifar100` preprocessing; normalization is per channel with the
  training set's channel mean and standard deviation.
  """
  crop_shape = (crop_size, crop_size, 3)
  mean = tf.constant(mean, tf.float32)
  std = tf.constant(std, tf.float32)

  def image_map(example):
    image = tf.cast(example['image'], tf.float32)
    if distort:
      # Op seeds of their own: the per-client randomness comes from the
      # global seed, which the training loop sets from (seed, round, client)
      # before it preprocesses a client's data; op determinism (--deterministic)
      # refuses a random op that has neither seed, e.g. when TFF traces this
      # map once to find the element type.
      image = tf.image.random_crop(image, size=crop_shape, seed=1)
      image = tf.image.random_flip_left_right(image, seed=2)
    else:
      image = tf.image.resize_with_crop_or_pad(image, crop_size, crop_size)
    return (image - mean) / std, example['label']

  def preprocess_fn(dataset):
    if spec.shuffle_buffer_size is not None and spec.shuffle_buffer_size > 1:
      dataset = dataset.shuffle(spec.shuffle_buffer_size)
    if spec.num_epochs > 1:
      dataset = dataset.repeat(spec.num_epochs)
    if spec.max_elements is not None:
      dataset = dataset.take(spec.max_elements)
    dataset = dataset.map(image_map, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(spec.batch_size)

  return preprocess_fn


def _channel_stats(x: np.ndarray):
  pixels = x.reshape(-1, 3)
  mean = pixels.mean(axis=0, dtype=np.float64)
  var = np.zeros(3)
  for start in range(0, len(pixels), 1 << 20):  # chunks keep memory small
    var += ((pixels[start:start + (1 << 20)] - mean) ** 2).sum(axis=0)
  return mean.astype(np.float32), np.sqrt(var / len(pixels)).astype(np.float32)


def _check_hparams(*, num_clients, examples_per_client, alpha, width, crop_size,
                   gn_groups, split) -> None:
  if split not in SPLITS:
    raise registry.TaskError(f'--cifar10_split={split!r}; valid values: {", ".join(SPLITS)}')
  registry.check_positive_hparams(
      'cifar10', num_clients=num_clients, examples_per_client=examples_per_client,
      width=width, crop_size=crop_size, gn_groups=gn_groups)
  if not alpha > 0:
    raise registry.TaskError(f'--cifar10_alpha={alpha} must be > 0')
  if crop_size > 32:
    raise registry.TaskError(f'--cifar10_crop_size={crop_size} must be <= 32')


def model_from_hparams(**hparams) -> tf.keras.Model:
  """The registry's `model_fn`: the task's ResNet-18-GN, reading no data."""
  _check_hparams(**hparams)
  return create_resnet18_gn(width=hparams['width'], image_size=hparams['crop_size'],
                            gn_groups=hparams['gn_groups'])


def create_cifar10_task(*, train_client_spec, eval_client_spec, data_source, data_dir,
                        cache_dir, seed, num_clients, examples_per_client, alpha,
                        width, crop_size, gn_groups, split) -> registry.Task:
  """The `cifar10_resnet18` task (see module docstring)."""
  _check_hparams(num_clients=num_clients, examples_per_client=examples_per_client,
                 alpha=alpha, width=width, crop_size=crop_size, gn_groups=gn_groups,
                 split=split)
  x_train, y_train, x_test, y_test, source = load_cifar10(
      data_source, data_dir, cache_dir,
      num_synthetic=num_clients * examples_per_client, seed=seed)
  if num_clients * examples_per_client > len(y_train):
    raise registry.TaskError(
        f'--cifar10_num_clients={num_clients} x --cifar10_examples_per_client='
        f'{examples_per_client} exceeds the {len(y_train)} training examples')
  num_test_clients = max(1, len(y_test) // examples_per_client)
  test_per_client = min(examples_per_client, len(y_test))
  seeds = np.random.SeedSequence(seed).spawn(2)
  try:
    train = federate(x_train, y_train, num_clients=num_clients,
                     examples_per_client=examples_per_client, alpha=alpha,
                     seed=seeds[0], prefix='train_', split=split)
    test = federate(x_test, y_test, num_clients=num_test_clients,
                    examples_per_client=test_per_client, alpha=alpha,
                    seed=seeds[1], prefix='test_', split=split)
  except ValueError as e:
    raise registry.TaskError(f'--cifar10_split={split}: {e}') from e
  mean, std = _channel_stats(x_train)

  # A partial of a module-level function (not a closure), so that the model
  # can be rebuilt in a fresh subprocess (tff_partial.measure.memory).
  keras_model_fn = functools.partial(
      create_resnet18_gn, width=width, image_size=crop_size, gn_groups=gn_groups)

  baseline = registry.make_baseline_task(
      train_data=train,
      test_data=test,
      train_preprocess_fn=create_preprocess_fn(
          train_client_spec, crop_size=crop_size, distort=True, mean=mean, std=std),
      eval_preprocess_fn=create_preprocess_fn(
          eval_client_spec, crop_size=crop_size, distort=False, mean=mean, std=std),
      keras_model_fn=keras_model_fn,
      loss_fn=_loss,
      metrics_fn=_metrics,
  )
  return registry.Task(
      name='cifar10_resnet18',
      baseline=baseline,
      keras_model_fn=keras_model_fn,
      loss_fn=_loss,
      metrics_fn=_metrics,
      data_source=source,
      dirichlet_split=True,
      random_preprocessing=True,
      data_description=(
          f'CIFAR-10 from {source}: {num_clients} train clients x '
          f'{examples_per_client} examples'
          + (' on average' if split == 'per_class' else '')
          + f', Dirichlet(alpha={alpha}) {split} split; '
          f'{num_test_clients} test clients x {test_per_client}'
          + (' (SYNTHETIC random images)' if source == 'synthetic' else '')),
  )


registry.register_task(
    'cifar10_resnet18', create_cifar10_task, flag_prefix='cifar10',
    hparams=collections.OrderedDict(
        num_clients=500, examples_per_client=100, alpha=1.0, width=64,
        crop_size=24, gn_groups=2, split='label_skew'),
    hparam_help={
        'num_clients': 'CIFAR-10 training clients (Dirichlet split)',
        'examples_per_client': 'examples of every CIFAR-10 client',
        'alpha': 'Dirichlet concentration of the label split (small: skewed)',
        'width': 'ResNet-18 base width (64 = standard ResNet-18)',
        'crop_size': 'side of the random (train) / central (test) crop',
        'gn_groups': 'GroupNorm groups',
        'split': ('label_skew: each client\'s labels ~ Dirichlet(alpha * prior), '
                  'examples_per_client each (Hsu et al., FedPT); per_class: each '
                  'class\'s images over the clients ~ Dirichlet(alpha), '
                  'examples_per_client on average (Yu et al. 2020)'),
    },
    data_sources=('auto', 'tff', 'jpeg', 'synthetic'),
    description='ResNet-18-GN on CIFAR-10, Dirichlet label split (FedPT, PVT)',
    model_fn=model_from_hparams)
