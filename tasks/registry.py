"""The task registry: every task of the four papers, selectable by name.

A task is a `tff.simulation.baselines.BaselineTask` (validated datasets and
preprocessing plus a `tff.learning` model function) together with what the
methods of this package need beyond it: the uncompiled Keras model with stable
layer names (FedPT freezes layers, PVT types variables, federated select slices
them by name), the loss and metrics, and where the data came from.

Each task family registers a `create_fn(**hparams, data_source, data_dir,
cache_dir, train_client_spec, eval_client_spec, seed)` together with its own
hyperparameters; binaries turn those into prefixed absl flags
(`--cifar10_num_clients`, ...) with `scripts/flag_groups.py`. A family also
registers a `model_fn(**hparams)` that builds its Keras model without data, so
that binaries check flags naming layers (`--frozen_layers`, `--select_layer`)
before they load the data (`keras_model_fn`).
"""

import collections
import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff

DATA_SOURCES = ('auto', 'tff', 'leaf', 'h5', 'jpeg', 'text', 'synthetic')
# What the training loop evaluates on: the task's test clients, or examples
# held out of the training clients (`Task.with_validation_split`).
EVAL_SPLITS = ('test', 'validation')


class TaskError(ValueError):
  """A task cannot be built as asked; the message names the flag to change."""


def seed_graph_if_unseeded() -> None:
  """Gives the current graph a seed (0) when it has none (not in eager mode).

  Random ops of a model (dropout, Keras initializers) take their op seeds from
  the graph seed. TFF traces models in graphs of its own, and the package
  builds throwaway models in fresh `tf.Graph`s to read their layers; those
  graphs have no seed, and op determinism (scripts' --deterministic) refuses
  unseeded random ops.
  """
  if not tf.executing_eagerly() and tf.compat.v1.get_default_graph().seed is None:
    tf.compat.v1.set_random_seed(0)


class GraphSeeded:
  """A `keras_model_fn` that seeds an unseeded graph first (picklable)."""

  def __init__(self, keras_model_fn: Callable[[], tf.keras.Model]):
    self.keras_model_fn = keras_model_fn

  def __call__(self) -> tf.keras.Model:
    seed_graph_if_unseeded()
    return self.keras_model_fn()


@dataclasses.dataclass(frozen=True)
class Task:
  """A federated task: TFF baseline task plus the Keras model behind it.

  Attributes:
    name: registry name, e.g. `emnist_cnn`.
    baseline: the `tff.simulation.baselines.BaselineTask` (datasets with
      preprocessing, and `model_fn` returning a `tff.learning` model).
    keras_model_fn: no-arg callable returning a new, uncompiled Keras model
      with stable layer names; `baseline.model_fn` wraps the same model.
    loss_fn: no-arg callable returning the Keras loss.
    metrics_fn: no-arg callable returning a list of Keras metrics.
    data_source: where the data came from (`tff`, `leaf`, `h5`, `jpeg`,
      `text`, `synthetic`).
    data_description: one human-readable line on the data (for logs/README).
    oov_token: token tasks: the out-of-vocabulary token id (federated select
      maps the words a client did not select to it); None elsewhere.
    eval_split: what `centralized_eval_dataset` (the training loop's
      evaluation) reads: `test` (the test clients) or `validation` (examples
      held out of the training clients by `with_validation_split`).
    random_preprocessing: the training preprocessing draws random numbers
      (CIFAR-10's crops and flips): the training loop then sets the global
      seed from (seed, round, client) before it preprocesses a client.
    dirichlet_split: the clients are a Dirichlet label split of a centralized
      dataset, with no test data of their own (CIFAR-10): `scripts.adapt`
      then judges participants by class-ratio accuracy on the global test set
      (Yu et al. 2020, sec. 4.2).
  """

  name: str
  baseline: tff.simulation.baselines.BaselineTask
  keras_model_fn: Callable[[], tf.keras.Model]
  loss_fn: Callable[[], tf.keras.losses.Loss]
  metrics_fn: Callable[[], list]
  data_source: str
  data_description: str = ''
  oov_token: Optional[int] = None
  eval_split: str = 'test'
  dirichlet_split: bool = False
  random_preprocessing: bool = False

  def __post_init__(self):
    if not isinstance(self.keras_model_fn, GraphSeeded):
      object.__setattr__(self, 'keras_model_fn', GraphSeeded(self.keras_model_fn))

  @property
  def train_data(self) -> tff.simulation.datasets.ClientData:
    return self.baseline.datasets.train_data

  @property
  def test_data(self):
    return self.baseline.datasets.test_data

  @property
  def population(self) -> int:
    """Number of training clients."""
    return len(self.train_data.client_ids)

  @property
  def num_test_clients(self) -> Optional[int]:
    test = self.test_data
    if isinstance(test, tff.simulation.datasets.ClientData):
      return len(test.client_ids)
    return None

  def preprocess_train_client(self, raw: tf.data.Dataset) -> tf.data.Dataset:
    """`baseline.datasets.train_preprocess_fn(raw)`, its map functions traced once.

    Called eagerly, the preprocessing traces its map functions (and TFF's
    text tasks build their lookup tables) anew for every client of every
    round, and TF 2.14 never returns all of the memory each one takes:
    measured 1.1 MB of RSS kept per `shakespeare_word` client dataset (none
    in one `tf.function`), and a 20-client DP run grew by 24-30 MB a round
    (issue 16, docs/architecture.md). In one `tf.function` they are traced on the first call only;
    the ops are the same, so are the batches (tests/registry_test.py).
    Tasks with `random_preprocessing` stay eager: their random ops take their
    seeds from the global seed when traced, which the training loop sets per
    client.
    """
    preprocess = self.baseline.datasets.train_preprocess_fn
    if self.random_preprocessing:
      return preprocess(raw)
    traced = self.__dict__.get('_traced_train_preprocess')
    if traced is None:
      traced = tf.function(preprocess)
      object.__setattr__(self, '_traced_train_preprocess', traced)  # a cache, not a field
    return traced(raw)

  def compiled_keras_model(self) -> tf.keras.Model:
    model = self.keras_model_fn()
    model.compile(loss=self.loss_fn(), metrics=self.metrics_fn())
    return model

  def with_batched_epochs(self, num_epochs: int) -> 'Task':
    """This task with each client's preprocessed training data passed `num_epochs` times.

    Keras `fit(epochs=E)` semantics: the task's preprocessing (built for one
    epoch) batches a client's examples once per pass, and every pass ends with
    its own partial batch, so a client takes exactly `num_epochs` times the
    batches of one epoch. TFF's `ClientSpec.num_epochs` instead repeats the
    examples before batching, so an epoch's last partial batch merges with the
    next epoch's first examples (a Shakespeare role with 5 sequences: one
    batch of 10 at 2 epochs, here two batches of 5). The passes reshuffle
    (the training loop's seeded shuffle reshuffles each iteration). Written
    here: TFF's baseline preprocessing has no such option. 1: this task.
    """
    if num_epochs < 1:
      raise TaskError(f'--client_epochs={num_epochs} must be a positive integer')
    if num_epochs == 1:
      return self
    return self._with_train_preprocess(
        lambda preprocess: lambda dataset: preprocess(dataset).repeat(num_epochs))

  def with_max_train_batches(self, max_batches: Optional[int]) -> 'Task':
    """This task with each client's preprocessed training data cut to `max_batches`.

    TFF's `ClientSpec.max_elements` counts raw elements before batching (images,
    but sentences or snippets for the text tasks); this counts batches, after
    the task's preprocessing, for every task alike. None or < 0: no limit.
    """
    if max_batches is None or max_batches < 0:
      return self
    return self._with_train_preprocess(
        lambda preprocess: lambda dataset: preprocess(dataset).take(max_batches))

  def _with_train_preprocess(self, wrap: Callable[[Callable], Callable]) -> 'Task':
    """This task with its training preprocessing replaced by `wrap(preprocess)`."""
    datasets = self.baseline.datasets
    baseline = tff.simulation.baselines.BaselineTask(
        tff.simulation.baselines.BaselineTaskDatasets(
            train_data=datasets.train_data,
            test_data=datasets.test_data,
            validation_data=datasets.validation_data,
            train_preprocess_fn=wrap(datasets.train_preprocess_fn),
            eval_preprocess_fn=datasets.eval_preprocess_fn),
        self.baseline.model_fn)
    return dataclasses.replace(self, baseline=baseline)

  def with_validation_split(self, fraction: float, seed: int) -> 'Task':
    """This task trained on all but a held-out `fraction` of each client's examples.

    Every training client keeps its id; each of its examples goes to the
    validation data with probability `fraction`, decided by a keyed hash of
    (`seed`, client id, example position), so the split is the same in every
    process and run with that seed, and no test client is touched. The
    returned task evaluates on the held-out examples (`eval_split='validation'`);
    they are its `baseline.datasets.validation_data`, as TFF's
    `BaselineTaskDatasets` names them.
    """
    if not 0.0 < fraction < 1.0:
      raise TaskError(f'--validation_fraction={fraction} must be in (0, 1)')
    if seed < 0:
      raise TaskError(f'--seed={seed} must be >= 0 for a validation split')
    datasets = self.baseline.datasets
    train = _HeldOutClientData(datasets.train_data, fraction, seed, held_out=False)
    validation = _HeldOutClientData(datasets.train_data, fraction, seed, held_out=True)
    baseline = tff.simulation.baselines.BaselineTask(
        tff.simulation.baselines.BaselineTaskDatasets(
            train_data=train,
            test_data=datasets.test_data,
            validation_data=validation,
            train_preprocess_fn=datasets.train_preprocess_fn,
            eval_preprocess_fn=datasets.eval_preprocess_fn),
        self.baseline.model_fn)
    return dataclasses.replace(
        self, baseline=baseline, eval_split='validation',
        data_description=(f'{self.data_description}; validation: {fraction:g} of '
                          f'the training examples held out (seed {seed})'))

  def centralized_test_dataset(self) -> tf.data.Dataset:
    """All test examples, preprocessed for evaluation (batched)."""
    return self._centralized(self.test_data)

  def centralized_eval_dataset(self) -> tf.data.Dataset:
    """The examples of `eval_split`, preprocessed for evaluation (batched)."""
    if self.eval_split == 'validation':
      return self._centralized(self.baseline.datasets.validation_data)
    return self.centralized_test_dataset()

  def _centralized(self, data) -> tf.data.Dataset:
    if isinstance(data, tff.simulation.datasets.ClientData):
      # A fixed client order: TFF's ClientData draws a random one without a
      # seed, which changes the evaluation's float sums from run to run.
      data = data.create_tf_dataset_from_all_clients(seed=0)
    return self.baseline.datasets.eval_preprocess_fn(data)


class _HeldOutClientData(tff.simulation.datasets.ClientData):
  """The training clients' examples that are (or are not) held out for validation.

  TFF's `ClientData.preprocess` maps a client's dataset without its id; the
  split needs the id, so this wraps both dataset constructors of the
  underlying `ClientData`. An example is held out when the keyed SipHash of
  `<client id>/<position>` (`tf.strings.to_hash_bucket_strong`, key from the
  seed) falls below `fraction` of the buckets.
  """

  _BUCKETS = 1 << 30

  def __init__(self, base, fraction: float, seed: int, *, held_out: bool):
    self._base = base
    self._threshold = int(round(fraction * self._BUCKETS))
    self._key = [int(seed), 0x76616C6964]  # second word: a fixed salt ("valid")
    self._held_out = held_out
    # The split of one client's dataset, traced once for every client: built
    # eagerly, its filter and map functions were traced anew for every
    # client of every round, and TF 2.14 kept 0.12 MB of each (shakespeare_word,
    # measured; `Task.preprocess_train_client` says why).
    self._traced_split = tf.function(self._split)

  def _split(self, dataset: tf.data.Dataset, client_id) -> tf.data.Dataset:
    prefix = tf.strings.join([tf.convert_to_tensor(client_id, tf.string), '/'])

    def keep(position, unused_example):
      name = tf.strings.join([prefix, tf.strings.as_string(position)])
      bucket = tf.strings.to_hash_bucket_strong(name, self._BUCKETS, self._key)
      return tf.equal(bucket < self._threshold, self._held_out)

    return dataset.enumerate().filter(keep).map(lambda _, example: example)

  @property
  def client_ids(self):
    return self._base.client_ids

  def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
    return self._traced_split(self._base.create_tf_dataset_for_client(client_id),
                              tf.constant(client_id, tf.string))

  @property
  def serializable_dataset_fn(self):
    base_fn = self._base.serializable_dataset_fn
    return lambda client_id: self._split(base_fn(client_id), client_id)

  @property
  def element_type_structure(self):
    return self._base.element_type_structure


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A registered task: how to build it and its own hyperparameters."""

  name: str
  create_fn: Callable[..., Task]
  flag_prefix: str
  hparams: Mapping[str, Any]
  hparam_help: Mapping[str, str]
  data_sources: Sequence[str]
  description: str
  model_fn: Optional[Callable[..., tf.keras.Model]] = None


_REGISTRY: 'collections.OrderedDict[str, TaskSpec]' = collections.OrderedDict()


def register_task(
    name: str,
    create_fn: Callable[..., Task],
    *,
    flag_prefix: str,
    hparams: Optional[Mapping[str, Any]] = None,
    hparam_help: Optional[Mapping[str, str]] = None,
    data_sources: Sequence[str] = ('auto', 'synthetic'),
    description: str = '',
    model_fn: Optional[Callable[..., tf.keras.Model]] = None,
) -> None:
  """Registers a task family member. `hparams` maps name -> default value.

  `model_fn(**hparams)`: the task's uncompiled Keras model (the same as the
  built task's `keras_model_fn`) from the hyperparameters alone, reading no
  data; `TaskError` for hyperparameters that make no model.
  """
  if name in _REGISTRY:
    raise ValueError(f'task {name!r} is already registered')
  hparams = dict(hparams or {})
  hparam_help = dict(hparam_help or {})
  _REGISTRY[name] = TaskSpec(
      name=name,
      create_fn=create_fn,
      flag_prefix=flag_prefix,
      hparams=hparams,
      hparam_help=hparam_help,
      data_sources=tuple(data_sources),
      description=description,
      model_fn=model_fn,
  )


def _load_builtin_tasks() -> None:
  # Importing a task module registers its tasks. Kept in one place so that the
  # registry is complete whichever module asks first.
  # pylint: disable=g-import-not-at-top,unused-import
  from tasks import emnist  # noqa: F401
  for optional in ('cifar10', 'stackoverflow', 'shakespeare'):
    try:
      __import__(f'tasks.{optional}')
    except ModuleNotFoundError as e:
      if e.name != f'tasks.{optional}':
        raise


_builtins_loaded = False


def task_specs() -> 'collections.OrderedDict[str, TaskSpec]':
  # Not "if the registry is empty": a test that imports one task module first
  # would otherwise leave the registry with that module's tasks only.
  global _builtins_loaded
  if not _builtins_loaded:
    _builtins_loaded = True
    _load_builtin_tasks()
  return _REGISTRY


def task_names() -> list[str]:
  return list(task_specs().keys())


def get_spec(name: str) -> TaskSpec:
  specs = task_specs()
  if name not in specs:
    raise TaskError(
        f'--task={name!r} is not a known task; valid values: '
        + ', '.join(specs)
    )
  return specs[name]


def create_task(
    name: str,
    *,
    train_client_spec: tff.simulation.baselines.ClientSpec,
    eval_client_spec: Optional[tff.simulation.baselines.ClientSpec] = None,
    data_source: str = 'auto',
    data_dir: Optional[str] = None,
    cache_dir: Optional[str] = None,
    seed: int = 0,
    **hparams,
) -> Task:
  """Builds task `name`; unknown hparams or data sources raise `TaskError`."""
  spec = get_spec(name)
  kwargs = _hparams_with_defaults(spec, hparams)
  if data_source not in spec.data_sources:
    raise TaskError(
        f'--data_source={data_source!r} is not available for --task={name}; '
        f'valid values: {", ".join(spec.data_sources)}'
    )
  if eval_client_spec is None:
    eval_client_spec = tff.simulation.baselines.ClientSpec(
        num_epochs=1, batch_size=128, shuffle_buffer_size=1
    )
  return spec.create_fn(
      train_client_spec=train_client_spec,
      eval_client_spec=eval_client_spec,
      data_source=data_source,
      data_dir=data_dir,
      cache_dir=cache_dir,
      seed=seed,
      **kwargs,
  )


def check_positive_hparams(prefix: str, **values) -> None:
  """`TaskError` naming `--<prefix>_<name>` for each value below 1."""
  for name, value in values.items():
    if value < 1:
      raise TaskError(f'--{prefix}_{name}={value} must be a positive integer')


def keras_model_fn(name: str, **hparams) -> Optional[GraphSeeded]:
  """A no-arg function building task `name`'s Keras model, loading no data.

  `hparams` as for `create_task` (the family's defaults fill the rest). None
  when the family registered no `model_fn`. Binaries check flags that name
  layers against this model before `create_task` loads the data, so that a
  typo is reported before a long data load.
  """
  spec = get_spec(name)
  kwargs = _hparams_with_defaults(spec, hparams)
  if spec.model_fn is None:
    return None
  return GraphSeeded(functools.partial(spec.model_fn, **kwargs))


def _hparams_with_defaults(spec: TaskSpec, hparams: Mapping[str, Any]) -> dict:
  """The family's default hparams updated by `hparams`; `TaskError` for unknown ones."""
  unknown = set(hparams) - set(spec.hparams)
  if unknown:
    raise TaskError(
        f'task {spec.name!r} has no hyperparameter(s) {sorted(unknown)}; it takes '
        f'{sorted(spec.hparams) or "none"}'
    )
  kwargs = dict(spec.hparams)
  kwargs.update(hparams)
  return kwargs


def synthetic_hint(num_clients: int) -> str:
  """The smoke-test advice ending a data-load error, for TFF synthetic data of `num_clients`.

  It names `--clients_per_round`: the default 10 exceeds TFF's synthetic populations.
  """
  return (f'--data_source=synthetic --clients_per_round={num_clients} for a smoke test '
          f"(TFF's synthetic data has {num_clients} clients).")


def make_baseline_task(
    *,
    train_data,
    test_data,
    train_preprocess_fn,
    eval_preprocess_fn,
    keras_model_fn,
    loss_fn,
    metrics_fn,
) -> tff.simulation.baselines.BaselineTask:
  """A `BaselineTask` whose `model_fn` wraps `keras_model_fn` for TFF.

  `BaselineTask` itself checks that the model's input spec matches the
  preprocessed data.
  """
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train_data,
      test_data=test_data,
      validation_data=None,
      train_preprocess_fn=train_preprocess_fn,
      eval_preprocess_fn=eval_preprocess_fn,
  )
  input_spec = datasets.element_type_structure

  def model_fn() -> tff.learning.models.VariableModel:
    seed_graph_if_unseeded()
    return tff.learning.models.from_keras_model(
        keras_model=keras_model_fn(),
        loss=loss_fn(),
        input_spec=input_spec,
        metrics=metrics_fn(),
    )

  return tff.simulation.baselines.BaselineTask(datasets, model_fn)
