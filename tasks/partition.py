"""Label-skewed federated splits of a centralized dataset by Dirichlet(alpha).

Hsu, Qi, Brown: "Measuring the effects of non-identical data distribution for
federated visual classification", 2019 (arXiv:1909.06335), as used for
CIFAR-10/100 by Reddi et al. 2020 and by FedPT (appendix, 500 clients x 100
examples, alpha = 1).

Each client draws a label distribution q ~ Dirichlet(alpha * p), p the label
prior of the pool, then draws each of its examples' labels from q, without
replacement from the pool; when a label's pool runs out, q is renormalized over
the labels that are left. Every client therefore gets exactly
`examples_per_client` examples, clients never share an example, and the
label skew grows as alpha shrinks (alpha -> inf: IID; alpha -> 0: one label
per client). Randomness comes from one `numpy.random.Generator` seeded by
`seed`, so a split is reproducible.

No library in the environment implements this split (TFF's CIFAR-100 ships
pre-partitioned), so it is written here.
"""

from typing import Optional

import numpy as np


def dirichlet_label_split(
    labels: np.ndarray,
    num_clients: int,
    examples_per_client: int,
    alpha: float,
    seed: int,
    num_classes: Optional[int] = None,
) -> list[np.ndarray]:
  """Splits example indices over clients with Dirichlet(alpha) label skew.

  Args:
    labels: integer labels of the pool, shape [n].
    num_clients: number of clients (> 0).
    examples_per_client: exact number of examples of every client (> 0);
      `num_clients * examples_per_client` must not exceed `n`.
    alpha: Dirichlet concentration (> 0).
    seed: seed (int or `numpy.random.SeedSequence`) of the
      `numpy.random.Generator` behind every random choice.
    num_classes: number of labels; default `max(labels) + 1`.

  Returns:
    A list of `num_clients` int64 arrays of indices into `labels`, each of
    length `examples_per_client`, pairwise disjoint.

  Raises:
    ValueError: an argument is out of range (the message names it).
  """
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f'labels must be a 1-D integer array, got {labels.dtype} {labels.shape}')
  if num_clients <= 0:
    raise ValueError(f'num_clients={num_clients} must be > 0')
  if examples_per_client <= 0:
    raise ValueError(f'examples_per_client={examples_per_client} must be > 0')
  if not alpha > 0:
    raise ValueError(f'alpha={alpha} must be > 0')
  if num_clients * examples_per_client > len(labels):
    raise ValueError(
        f'num_clients * examples_per_client = {num_clients} * '
        f'{examples_per_client} exceeds the {len(labels)} examples available')
  if num_classes is None:
    num_classes = int(labels.max()) + 1 if len(labels) else 0
  if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(f'labels must lie in [0, {num_classes}); num_classes={num_classes}')

  rng = np.random.default_rng(seed)
  # Per label, its example indices in a random order; `taken[c]` of them used.
  pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
  remaining = np.array([len(p) for p in pools], dtype=np.int64)
  taken = np.zeros(num_classes, dtype=np.int64)
  prior = remaining / remaining.sum()

  clients = []
  for _ in range(num_clients):
    q = rng.dirichlet(alpha * prior + 1e-300)  # prior may hold zeros
    q = np.nan_to_num(q, nan=0.0)
    if q.sum() <= 0:  # extreme alpha underflows: all mass on one label
      q = np.zeros(num_classes)
      q[rng.choice(num_classes, p=prior)] = 1.0
    indices = np.empty(examples_per_client, dtype=np.int64)
    for j in range(examples_per_client):
      p = q * (remaining > 0)
      if p.sum() <= 0:  # all of this client's labels ran out: fall back to what is left
        p = remaining.astype(np.float64)
      c = rng.choice(num_classes, p=p / p.sum())
      indices[j] = pools[c][taken[c]]
      taken[c] += 1
      remaining[c] -= 1
    clients.append(indices)
  return clients


def _largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
  """Integer counts proportional to `shares` that sum to `total` exactly."""
  raw = shares / shares.sum() * total
  counts = np.floor(raw).astype(np.int64)
  order = np.argsort(-(raw - counts), kind='stable')
  counts[order[:total - counts.sum()]] += 1
  return counts


def dirichlet_class_split(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed,
    num_classes: Optional[int] = None,
    num_examples: Optional[int] = None,
) -> list[np.ndarray]:
  """Splits each class's examples over clients by Dirichlet(alpha, ..., alpha).

  The per-class allocation of Yu, Bagdasaryan, Shmatikov 2020 (sec. 4.2:
  "we allocate images from each class to participants using Dirichlet
  distribution", after Hsu et al. 2019), not `dirichlet_label_split`'s
  per-client label distribution: for every class, shares
  q ~ Dirichlet(alpha * 1_num_clients) over the clients, and the class's
  examples (in a random order) go to the clients in those proportions
  (largest-remainder rounding, so every example is used once). Clients get
  different numbers of examples; small alpha concentrates each class on few
  clients. Written here: no library in the environment has it.

  Args:
    labels: integer labels, shape [n].
    num_clients: number of clients (> 0).
    alpha: Dirichlet concentration per client (> 0).
    seed: seed (int or `numpy.random.SeedSequence`).
    num_classes: number of labels; default `max(labels) + 1`.
    num_examples: split a class-stratified random subset of this many
      examples (default all n).

  Returns:
    `num_clients` int64 index arrays, pairwise disjoint, covering the pool.

  Raises:
    ValueError: an argument is out of range, or a client would get no example.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f'labels must be a 1-D integer array, got {labels.dtype} {labels.shape}')
  if num_clients <= 0:
    raise ValueError(f'num_clients={num_clients} must be > 0')
  if not alpha > 0:
    raise ValueError(f'alpha={alpha} must be > 0')
  num_examples = len(labels) if num_examples is None else int(num_examples)
  if not 0 < num_examples <= len(labels):
    raise ValueError(f'num_examples={num_examples} must be in [1, {len(labels)}]')
  if num_classes is None:
    num_classes = int(labels.max()) + 1
  rng = np.random.default_rng(seed)
  by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
  sizes = np.array([len(i) for i in by_class], np.int64)
  if num_examples < len(labels):
    sizes = _largest_remainder(sizes.astype(np.float64), num_examples)
  parts = [[] for _ in range(num_clients)]
  for indices, size in zip(by_class, sizes):
    if not size:
      continue
    shares = rng.dirichlet(np.full(num_clients, float(alpha)))
    if not np.isfinite(shares).all() or shares.sum() <= 0:  # tiny alpha underflows
      shares = np.zeros(num_clients)
      shares[rng.integers(num_clients)] = 1.0
    counts = _largest_remainder(shares, size)
    for client, chunk in enumerate(np.split(indices[:size], np.cumsum(counts)[:-1])):
      parts[client].append(chunk)
  clients = [np.concatenate(p).astype(np.int64) if p else np.zeros(0, np.int64)
             for p in parts]
  empty = [i for i, c in enumerate(clients) if not len(c)]
  if empty:
    raise ValueError(f'clients {empty[:5]} get no example: use fewer clients or a '
                     f'larger alpha than {alpha}')
  return clients


def label_histograms(labels: np.ndarray, clients: list[np.ndarray],
                     num_classes: int) -> np.ndarray:
  """[num_clients, num_classes] label counts of a split."""
  labels = np.asarray(labels)
  return np.stack([np.bincount(labels[c], minlength=num_classes) for c in clients])


def mean_label_entropy(labels: np.ndarray, clients: list[np.ndarray],
                       num_classes: int) -> float:
  """Mean over clients of the entropy (nats) of the client's label histogram."""
  hist = label_histograms(labels, clients, num_classes).astype(np.float64)
  p = hist / hist.sum(axis=1, keepdims=True)
  with np.errstate(divide='ignore', invalid='ignore'):
    ent = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
  return float(ent.mean())
