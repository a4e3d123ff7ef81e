"""Federated EMNIST / FEMNIST (62 classes, one client per writer).

Models:
* `emnist_cnn`: the FedAvg CNN of McMahan et al. 2017 (conv5x5 32, pool,
  conv5x5 64, pool, dense 512, dense 62); federated select slices `conv2`.
* `emnist_cnn_gn`: the same with GroupNorm after `conv2` (FedPT appendix B,
  table 6); FedPT freezes `dense1`.
* `emnist_2nn`: dense 200, dense 200, dense 62 (McMahan et al. 2017);
  federated select slices `dense1`.

Data, in order: TFF's EMNIST (`tff.simulation.datasets.emnist.load_data`, from
`--cache_dir` or downloaded when online); a LEAF FEMNIST directory or archive
(`--data_source=leaf --data_dir=...`); TFF's synthetic EMNIST only with
`--data_source=synthetic`. Preprocessing is TFF's
(`tff.simulation.baselines.emnist`).
"""

import collections
import functools
import glob
import json
import os
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import data_utils
from tasks import registry

NUM_CLASSES = 62
_EMNIST_SQLITE = 'emnist_all.sqlite'


# ----------------------------------------------------------------------------
# Models (stable layer names; see DESIGN.md).
def create_cnn(num_classes: int = NUM_CLASSES, group_norm: bool = False) -> tf.keras.Model:
  """FedAvg CNN (McMahan et al. 2017), optionally with GroupNorm after conv2."""
  layers = [
      tf.keras.layers.Input(shape=(28, 28, 1), name='pixels'),
      tf.keras.layers.Conv2D(32, 5, padding='same', activation='relu', name='conv1'),
      tf.keras.layers.MaxPool2D(2, name='pool1'),
      tf.keras.layers.Conv2D(64, 5, padding='same', activation='relu', name='conv2'),
  ]
  if group_norm:
    layers.append(tf.keras.layers.GroupNormalization(groups=8, name='group_norm'))
  layers += [
      tf.keras.layers.MaxPool2D(2, name='pool2'),
      tf.keras.layers.Flatten(name='flatten'),
      tf.keras.layers.Dense(512, activation='relu', name='dense1'),
      tf.keras.layers.Dense(num_classes, name='dense2'),
  ]
  return tf.keras.Sequential(layers, name='emnist_cnn_gn' if group_norm else 'emnist_cnn')


def create_2nn(num_classes: int = NUM_CLASSES) -> tf.keras.Model:
  """2NN (McMahan et al. 2017): two hidden dense layers of 200 units."""
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(28, 28, 1), name='pixels'),
      tf.keras.layers.Flatten(name='flatten'),
      tf.keras.layers.Dense(200, activation='relu', name='dense1'),
      tf.keras.layers.Dense(200, activation='relu', name='dense2'),
      tf.keras.layers.Dense(num_classes, name='dense3'),
  ], name='emnist_2nn')


def _loss():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _metrics():
  return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]


# ----------------------------------------------------------------------------
# Data.
def load_leaf_femnist(data_dir: str, cache_dir: Optional[str] = None):
  """(train, test) `ClientData` from a LEAF FEMNIST directory or .tar.xz.

  The directory holds `train/*.json` and `test/*.json`, each
  `{"users": [...], "num_samples": [...], "user_data": {u: {"x": [[784]],
  "y": [...]}}}` with pixels in [0, 1], background 1.0 (TFF's convention).
  LEAF has no TFF reader, so this one is written here.
  """
  root = data_utils.unpack_if_archive(
      data_dir, cache_dir, flag='--data_dir', must_contain=('train', 'test'))
  splits = []
  for split in ('train', 'test'):
    files = sorted(glob.glob(os.path.join(root, split, '*.json')))
    if not files:
      raise registry.TaskError(
          f'--data_dir={data_dir!r}: no {split}/*.json files (expected the '
          'LEAF FEMNIST layout: train/*.json and test/*.json with "users", '
          '"num_samples" and "user_data")')
    per_client = collections.OrderedDict()
    for path in files:
      try:
        with open(path) as f:
          shard = json.load(f)
        user_data = shard['user_data']
      except (OSError, ValueError, KeyError) as e:
        raise registry.TaskError(
            f'--data_dir={data_dir!r}: {path} is not a LEAF json shard ({e})') from e
      for user in shard['users']:
        x = np.asarray(user_data[user]['x'], dtype=np.float32)
        y = np.asarray(user_data[user]['y'], dtype=np.int32)
        if x.ndim != 2 or x.shape[1] != 784 or len(x) != len(y):
          raise registry.TaskError(
              f'--data_dir={data_dir!r}: writer {user} in {path} has x of '
              f'shape {x.shape} and {len(y)} labels; expected [n, 784] and n')
        pixels = x.reshape(-1, 28, 28)
        if user in per_client:  # a writer split over several shards
          old = per_client[user]
          pixels = np.concatenate([old['pixels'], pixels])
          y = np.concatenate([old['label'], y])
        per_client[user] = collections.OrderedDict(label=y, pixels=pixels)
    splits.append(data_utils.client_data_from_arrays(per_client))
  return splits[0], splits[1]


def _load_tff_emnist(cache_dir: Optional[str]):
  return tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=cache_dir)


def load_emnist(data_source: str, data_dir: Optional[str], cache_dir: Optional[str]):
  """(train, test, source) following DESIGN.md's order; never silently synthetic."""
  if data_source == 'synthetic':
    data = tff.simulation.datasets.emnist.get_synthetic()
    return data, data, 'synthetic'
  if data_source == 'leaf':
    if not data_dir:
      raise registry.TaskError('--data_source=leaf needs --data_dir (a LEAF FEMNIST directory or .tar.xz)')
    return (*load_leaf_femnist(data_dir, cache_dir), 'leaf')
  has_cache = bool(cache_dir) and os.path.exists(os.path.join(cache_dir, _EMNIST_SQLITE))
  if data_source == 'auto' and data_dir and not has_cache:
    return (*load_leaf_femnist(data_dir, cache_dir), 'leaf')
  try:
    return (*_load_tff_emnist(cache_dir), 'tff')
  except Exception as e:  # pylint: disable=broad-except  (network errors vary)
    raise registry.TaskError(
        "TFF's EMNIST could not be loaded (no "
        f"{os.path.join(cache_dir or '<cache_dir>', _EMNIST_SQLITE)} and no "
        f'download: {type(e).__name__}). Point at local data with '
        '--data_source=leaf --data_dir=<LEAF FEMNIST dir or .tar.xz> (e.g. '
        '../shared/data/femnist_leaf_sample.tar.xz), or use '
        + registry.synthetic_hint(2)) from e


def _create(model_builder, name):
  def create_fn(*, train_client_spec, eval_client_spec, data_source, data_dir,
                cache_dir, seed):
    del seed  # EMNIST has a natural split.
    train, test, source = load_emnist(data_source, data_dir, cache_dir)
    preprocess = tff.simulation.baselines.emnist.emnist_preprocessing.create_preprocess_fn
    baseline = registry.make_baseline_task(
        train_data=train,
        test_data=test,
        train_preprocess_fn=preprocess(train_client_spec, emnist_task='character_recognition'),
        eval_preprocess_fn=preprocess(eval_client_spec, emnist_task='character_recognition'),
        keras_model_fn=model_builder,
        loss_fn=_loss,
        metrics_fn=_metrics,
    )
    return registry.Task(
        name=name,
        baseline=baseline,
        keras_model_fn=model_builder,
        loss_fn=_loss,
        metrics_fn=_metrics,
        data_source=source,
        data_description=(
            f'EMNIST/FEMNIST 62 classes from {source}: '
            f'{len(train.client_ids)} train writers'),
    )
  return create_fn


_SOURCES = ('auto', 'tff', 'leaf', 'synthetic')
for _name, _model_fn, _description in (
    ('emnist_cnn', create_cnn, 'FedAvg CNN on FEMNIST'),
    ('emnist_cnn_gn', functools.partial(create_cnn, group_norm=True),
     'FedAvg CNN + GroupNorm after conv2 on FEMNIST (FedPT)'),
    ('emnist_2nn', create_2nn, '2NN (200-200) on FEMNIST')):
  registry.register_task(
      _name, _create(_model_fn, _name), flag_prefix='emnist', data_sources=_SOURCES,
      description=_description, model_fn=_model_fn)
