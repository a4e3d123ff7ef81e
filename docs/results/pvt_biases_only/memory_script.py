"""Issue 19 item 3: client extra training memory, AVT vs PVT biases_only (one step, fresh subprocesses)."""
import functools
import json

import tensorflow as tf

from tasks import cifar10, emnist
from tff_partial.masks import schemes, variable_types
from tff_partial.measure import memory


def loss():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def main():
  cases = [
      ('emnist_cnn', functools.partial(emnist.create_cnn), (28, 28, 1), 20, 62),
      ('cifar10_resnet18 width 16', functools.partial(cifar10.create_resnet18_gn, width=16, image_size=24), (24, 24, 3), 32, 10),
      ('cifar10_resnet18 width 64', functools.partial(cifar10.create_resnet18_gn, width=64, image_size=24), (24, 24, 3), 32, 10),
  ]
  for name, fn, shape, batch, classes in cases:
    model = fn()
    mask = schemes.MaskSampler(variable_types.classify_variables(model), 'biases_only').mask(0, 0)
    row = {'model': name, 'batch': batch}
    for label, m in (('avt', None), ('biases_only', [bool(v) for v in mask])):
      row[label] = memory.client_training_peak(fn, loss, shape, batch, trainable_mask=m,
                                               num_classes=classes)
    print(json.dumps(row), flush=True)


if __name__ == '__main__':
  main()
