"""Timing `tff.federated_select` against a broadcast of the same payload.

TFF 0.87 runs the select function once per key of every client (and moves
each selected value separately), so selecting 1,000 single rows per client is
far slower than broadcasting 1,000 rows. Bucketed keys (`slicing`'s
`bucket_size`: one key selects a block of B rows) cut the number of calls by
B. This module measures both against `tff.federated_broadcast` of a tensor of
the same size, on TFF's default (C++) execution context.

  time_select_vs_broadcast(num_keys=1000, clients=50, row_dim=96, bucket_size=50)
  -> {'select_s': ..., 'broadcast_s': ..., 'ratio': ..., ...}

Measured 2026-11-21 on the shared 2-core CPU machine (busy), 1,000 rows of
96 floats (384 KB) per client, 50 clients, 10,000-row table, median of runs:

  bucket_size  select calls/client  select_s  broadcast_s  ratio
        1            1000            19.10      0.030      640x
       10             100             0.86      0.035       25x
       50              20             0.50      0.045       11x
      100              10             0.27      0.027       10x
     1000               1             0.31      0.029       11x

About 10x is TFF's fixed cost of a select round over a broadcast (the
broadcast value is shared, each selected value is materialized per client);
buckets of >= 50 rows reach it, 60-70x faster than one row per key.

Command line: `python -m tff_partial.select.bench --num_keys=1000 --clients=50
--row_dim=96 --bucket_sizes=1,10,50,100`.
"""

import statistics
import time

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def _time_pair(fn_a, args_a, fn_b, args_b, repeats):
  """Median seconds of fn_a and of fn_b, called alternately after a warm-up each."""
  fn_a(*args_a)  # warm-up: compilation and executor start
  fn_b(*args_b)
  times_a, times_b = [], []
  for _ in range(repeats):
    for fn, args, times in ((fn_a, args_a, times_a), (fn_b, args_b, times_b)):
      start = time.perf_counter()
      fn(*args)
      times.append(time.perf_counter() - start)
  return statistics.median(times_a), statistics.median(times_b)


FEDERATED_SELECT = 'federated_select'
BROADCAST_GATHER = 'broadcast_gather'
IMPLEMENTATIONS = (FEDERATED_SELECT, BROADCAST_GATHER)


def time_select_vs_broadcast(num_keys: int = 1000, clients: int = 50,
                             row_dim: int = 96, bucket_size: int = 1,
                             num_rows: int = None, repeats: int = 3,
                             seed: int = 0,
                             implementation: str = FEDERATED_SELECT) -> dict:
  """Seconds of one round of select vs broadcast of the same client payload.

  Args:
    num_keys: rows each client needs (e.g. its 1,000 most frequent words).
    clients: clients in the round.
    row_dim: floats per row (an embedding width).
    bucket_size: rows per select key; each client sends num_keys/bucket_size
      keys (rounded up), so it receives at least num_keys rows.
    num_rows: rows of the server table (default 10 * num_keys).
    repeats: timed repetitions (median reported) after one warm-up call.
    seed: seed of the clients' keys.
    implementation: `federated_select` (TFF's intrinsic: one select-function
      call per key, one sequence per client) or `broadcast_gather` (the
      select paper's option 1, as `process.py` simulates select: the server
      value is broadcast and each client gathers its keys' rows).

  Returns:
    dict with `select_s`, `broadcast_s`, `ratio` (select / broadcast),
    `select_calls_per_client`, and the bytes each client receives.
  """
  if num_keys < 1 or clients < 1 or row_dim < 1 or bucket_size < 1:
    raise ValueError('num_keys, clients, row_dim and bucket_size must be >= 1')
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f'implementation={implementation!r}; valid values: '
                     + ', '.join(IMPLEMENTATIONS))
  num_rows = num_rows or 10 * num_keys
  num_buckets = -(-num_rows // bucket_size)
  keys_per_client = -(-num_keys // bucket_size)
  if keys_per_client > num_buckets:
    raise ValueError(f'num_keys={num_keys} > num_rows={num_rows}')
  table_type = tff.TensorType(np.float32, [num_buckets, bucket_size, row_dim])
  payload_type = tff.TensorType(np.float32, [keys_per_client * bucket_size, row_dim])
  if keys_per_client * bucket_size > num_buckets * bucket_size:
    raise ValueError(f'num_keys={num_keys} > num_rows={num_rows}')
  keys_type = tff.TensorType(np.int32, [keys_per_client])

  @tff.tensorflow.computation(table_type, np.int32)
  def select_fn(table, key):
    return tf.gather(table, key)

  @tff.tensorflow.computation(tff.SequenceType(select_fn.type_signature.result))
  def client_reduce(rows):
    # The client assembles its rows (as the select process does) and uses them.
    block = rows.batch(keys_per_client).get_single_element()
    return tf.reduce_sum(block)

  @tff.tensorflow.computation(table_type, keys_type)
  def client_gather(table, keys):
    return tf.reduce_sum(tf.gather(table, keys))

  @tff.tensorflow.computation(payload_type)
  def client_use(payload):
    return tf.reduce_sum(payload)

  if implementation == FEDERATED_SELECT:
    @tff.federated_computation(tff.FederatedType(table_type, tff.SERVER),
                               tff.FederatedType(keys_type, tff.CLIENTS))
    def select_round(table, keys):
      rows = tff.federated_select(
          keys, tff.federated_value(num_buckets - 1, tff.SERVER), table, select_fn)
      return tff.federated_sum(tff.federated_map(client_reduce, rows))
  else:
    @tff.federated_computation(tff.FederatedType(table_type, tff.SERVER),
                               tff.FederatedType(keys_type, tff.CLIENTS))
    def select_round(table, keys):
      at_clients = tff.federated_broadcast(table)
      return tff.federated_sum(tff.federated_map(client_gather, (at_clients, keys)))

  @tff.tensorflow.computation(table_type)
  def server_payload(table):
    rows = tf.reshape(table, [num_buckets * bucket_size, row_dim])
    return rows[:keys_per_client * bucket_size]

  # The same arguments as select_round (the server holds the table in both),
  # so the two differ only in how the clients' payloads reach them.
  @tff.federated_computation(tff.FederatedType(table_type, tff.SERVER),
                             tff.FederatedType(keys_type, tff.CLIENTS))
  def broadcast_round(table, keys):
    del keys
    at_clients = tff.federated_broadcast(tff.federated_map(server_payload, table))
    return tff.federated_sum(tff.federated_map(client_use, at_clients))

  rng = np.random.default_rng(seed)
  table = rng.normal(size=(num_buckets, bucket_size, row_dim)).astype(np.float32)
  keys = [np.sort(rng.choice(num_buckets, size=keys_per_client, replace=False)).astype(np.int32)
          for _ in range(clients)]
  select_s, broadcast_s = _time_pair(select_round, (table, keys),
                                     broadcast_round, (table, keys), repeats)
  return {
      'implementation': implementation,
      'num_keys': num_keys, 'clients': clients, 'row_dim': row_dim,
      'bucket_size': bucket_size, 'num_rows': num_rows,
      'select_calls_per_client': (keys_per_client if implementation == FEDERATED_SELECT
                                  else 0),
      'bytes_per_client': keys_per_client * bucket_size * row_dim * 4,
      'select_s': select_s, 'broadcast_s': broadcast_s,
      'ratio': select_s / broadcast_s,
  }


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  for bucket in f.bucket_sizes:
    for implementation in f.implementations:
      print(time_select_vs_broadcast(f.num_keys, f.clients, f.row_dim, int(bucket),
                                     repeats=f.repeats, implementation=implementation),
            flush=True)


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_integer('num_keys', 1000, 'Rows each client needs.')
  flags.DEFINE_integer('clients', 50, 'Clients per round.')
  flags.DEFINE_integer('row_dim', 96, 'Floats per row.')
  flags.DEFINE_list('bucket_sizes', ['1', '10', '50', '100'], 'Rows per key.')
  flags.DEFINE_integer('repeats', 3, 'Timed repetitions.')
  flags.DEFINE_list('implementations', list(IMPLEMENTATIONS), 'Select implementations.')
  app.run(main)
