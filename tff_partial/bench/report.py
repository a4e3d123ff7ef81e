"""Benchmark reports: ratios, the Markdown table, benchmark.json / .md."""

import json
import os
from typing import Optional

from tff_partial.bench import references
from tff_partial.runtime import usage

TFF_REFERENCE = 'tff_fedavg'

METHOD_NOTE = (
    's/round: median wall seconds of a round after warm-up (federated: '
    'building the cohort\'s client values + process.next). CPU s/round: '
    'median user+system CPU seconds of the same (this process and its TFF '
    'worker); steadier than wall time on a shared machine. client s: seconds '
    'of process.next minus those of the same round on empty client datasets '
    '(what remains is local training). ex/s: examples trained per round / '
    's/round. vs TFF: time ratio to tff_fedavg (TFF build_weighted_fed_avg '
    'called with its defaults and TFF\'s data path; lower is faster). vs '
    'limit / CPU vs limit: examples per wall / CPU second as a fraction of '
    'keras_in_memory, the honest limit (Keras model.fit over the same '
    'batches materialized in memory, timed warm, tf.data autotuning off; '
    'higher is better). keras_in_memory_autotune: the same with autotuning on '
    '(Keras\'s default; its iterator teardown waits for the autotuner\'s next '
    'wake-up, so rounds end at 1.27 s, 2.55 s, ...). '
    'keras_tff_data_path: model.fit over the freshly built TFF client '
    'datasets. tf_function_floor: the same gradient steps in one tf.function '
    'loop over the in-memory batches. Bytes: exact payload per client per '
    'round from the process type signature. extra mem: client extra training '
    'memory, the TensorFlow allocator peak of one training step on one batch '
    'that differentiates only the variables the client trains, minus the '
    'forward-only peak, each in a fresh subprocess on TF\'s Eigen path with '
    'the BFC allocator in one fixed order, the same on any x86-64 CPU and '
    'oneDNN setting (tff_partial.measure.memory; mean and max over the first '
    'clients\' masks). All configurations and '
    'references ran side by side in one process on the same sampled clients, '
    'interleaved round by round; on a shared machine timings are still noisy.')


def _ratio(a, b):
  return a / b if a is not None and b else None


def add_ratios(rows: list[dict], reference_rows: list[dict]) -> None:
  """Adds `*_vs_tff_fedavg` and `*_vs_limit` columns in place."""
  ref = next((r for r in rows if r['name'] == TFF_REFERENCE and 'skipped' not in r), None)
  limit = next((r for r in reference_rows if r['name'] == references.LIMIT), None)

  def per_cpu(row):
    cpu = row.get('median_round_cpu_seconds')
    return row['examples_per_round'] / cpu if cpu else None

  for r in rows + reference_rows:
    if 'skipped' in r:
      continue
    if ref and 'bytes_down_per_client' in r:
      r['round_time_vs_tff_fedavg'] = _ratio(r['median_round_seconds'],
                                             ref['median_round_seconds'])
      r['round_cpu_vs_tff_fedavg'] = _ratio(r.get('median_round_cpu_seconds'),
                                            ref.get('median_round_cpu_seconds'))
      r['client_time_vs_tff_fedavg'] = _ratio(r.get('client_training_seconds'),
                                              ref.get('client_training_seconds'))
      ref_bytes = ref['bytes_down_per_client'] + ref['bytes_up_per_client']
      own = r['bytes_down_per_client'] + r['bytes_up_per_client']
      r['bytes_vs_tff_fedavg'] = _ratio(own, ref_bytes)
    if limit:
      r['throughput_vs_limit'] = _ratio(r.get('examples_per_second'),
                                        limit.get('examples_per_second'))
      r['cpu_throughput_vs_limit'] = _ratio(per_cpu(r), per_cpu(limit))


def fmt(value, spec='.3g'):
  if value is None:
    return '-'
  if isinstance(value, float):
    return format(value, spec)
  return str(value)


def _mib(value):
  return '-' if value is None else f'{value / 2**20:.2f}'


def _mem(row):
  if row.get('client_extra_memory_bytes') is None:
    return '-'
  return (f"{_mib(row['client_extra_memory_bytes'])}/"
          f"{_mib(row['client_extra_memory_bytes_max'])}")


_COLUMNS = ('config', 's/round', 'CPU s/round', 'vs TFF', 'CPU vs TFF', 'client s',
            'ex/s', 'vs limit', 'CPU vs limit', 'down KiB', 'up KiB', 'bytes vs TFF',
            'extra mem MiB mean/max', 'accuracy')


def _row_cells(r) -> list[str]:
  if 'bytes_down_per_client' not in r:  # a centralized reference
    return [r['name'], fmt(r['median_round_seconds']), fmt(r.get('median_round_cpu_seconds')),
            '', '', '', fmt(r.get('examples_per_second'), '.0f'),
            fmt(r.get('throughput_vs_limit')), fmt(r.get('cpu_throughput_vs_limit')),
            '', '', '', '', '']
  return [
      r['name'], fmt(r['median_round_seconds']), fmt(r.get('median_round_cpu_seconds')),
      fmt(r.get('round_time_vs_tff_fedavg')), fmt(r.get('round_cpu_vs_tff_fedavg')),
      fmt(r.get('client_training_seconds')), fmt(r.get('examples_per_second'), '.0f'),
      fmt(r.get('throughput_vs_limit')), fmt(r.get('cpu_throughput_vs_limit')),
      f"{r['bytes_down_per_client'] / 1024:.1f}", f"{r['bytes_up_per_client'] / 1024:.1f}",
      fmt(r.get('bytes_vs_tff_fedavg')), _mem(r), fmt(r.get('accuracy'), '.4f')]


def table(rows: list[dict]) -> list[str]:
  lines = ['| ' + ' | '.join(_COLUMNS) + ' |', '|' + '---|' * len(_COLUMNS)]
  for r in rows:
    if 'skipped' in r:
      lines.append(f"| {r['name']} | skipped: {r['skipped']} |" + ' |' * (len(_COLUMNS) - 2))
    else:
      lines.append('| ' + ' | '.join(_row_cells(r)) + ' |')
  return lines


def breakdown(rows: list[dict]) -> list[str]:
  """Where a round's wall time goes, per federated configuration."""
  lines = ['| config | s/round | client values (Python) | process.next on empty clients '
           '| client training (rest) |', '|---|---|---|---|---|']
  for r in rows:
    if 'skipped' in r or r.get('median_empty_round_seconds') is None:
      continue
    lines.append(f"| {r['name']} | {fmt(r['median_round_seconds'])} | "
                 f"{fmt(r.get('median_data_seconds'))} | "
                 f"{fmt(r.get('median_empty_round_seconds'))} | "
                 f"{fmt(r.get('client_training_seconds'))} |")
  return lines


def _epoch_batching(report: dict) -> str:
  """' (batched per epoch)' for --client_epoch_batching=per_epoch, else ''."""
  if report.get('client_epoch_batching') == 'per_epoch':
    return ' (batched per epoch)'
  return ''


def markdown(report: dict) -> str:
  lines = [f"# Benchmark: {report['task']}", '',
           f"{report['machine']}. Load average at end: {report.get('load_at_end', '-')}.", '',
           f"Data: {report['data']}. Clients per round: {report['clients_per_round']}, "
           f"rounds: {report['rounds']} ({report['warmup_rounds']} warm-up), client batch "
           f"size {report['client_batch_size']}, epochs {report['client_epochs']}"
           f"{_epoch_batching(report)}, max "
           f"batches {report['client_max_batches']}, seed {report['seed']}. Runtime: "
           f"{report['runtime']}.", '']
  rows = report.get('rows') or []
  refs = report.get('references') or []
  if rows or refs:
    lines += table(rows + refs)
    split = breakdown(rows)
    if len(split) > 2:
      lines += ['', '## Where a round\'s wall seconds go (medians)', ''] + split
  if report.get('scaling'):
    cohorts = report['cohorts']
    lines += ['', '## Seconds per round vs clients per round', '',
              '| config | ' + ' | '.join(str(c) for c in cohorts)
              + ' | s/client (slope) | intercept s | R^2 |',
              '|' + '---|' * (len(cohorts) + 4)]
    for name, s in report['scaling'].items():
      if 'skipped' in s:
        lines.append(f'| {name} | skipped: {s["skipped"]} |')
        continue
      lines.append(f"| {name} | " + ' | '.join(fmt(v) for v in s['median_round_seconds'])
                   + f" | {fmt(s.get('slope'))} | {fmt(s.get('intercept'))} | "
                   f"{fmt(s.get('r2'), '.4f')} |")
      if s.get('cpu_fit'):
        fit = s['cpu_fit']
        lines.append(f"| {name} CPU s | "
                     + ' | '.join(fmt(v) for v in s['median_round_cpu_seconds'])
                     + f" | {fmt(fit['slope'])} | {fmt(fit['intercept'])} | "
                     f"{fmt(fit['r2'], '.4f')} |")
    lines += usage.ResourceUsage.markdown_rows(report)
  lines += ['', 'How to read it: ' + report['method_note'], '']
  for r in rows:
    if r.get('bytes_note'):
      lines.append(f"- {r['name']} bytes: {r['bytes_note']}")
    if r.get('memory_note'):
      lines.append(f"- {r['name']} memory: {r['memory_note']}")
  return '\n'.join(lines) + '\n'


def select_markdown(report: dict) -> str:
  lines = ['# Benchmark: federated select vs broadcast of the same payload', '',
           f"{report['machine']}. Load average at end: {report.get('load_at_end', '-')}.", '',
           '| implementation | rows per key | select calls per client | KiB per client | '
           'clients | select s | broadcast s | select / broadcast |',
           '|---|---|---|---|---|---|---|---|']
  for r in report['select_vs_broadcast']:
    lines.append(f"| {r.get('implementation', 'federated_select')} | {r['bucket_size']} | "
                 f"{r['select_calls_per_client']} | {r['bytes_per_client'] / 1024:.0f} | "
                 f"{r['clients']} | {fmt(r['select_s'])} | {fmt(r['broadcast_s'])} | "
                 f"{fmt(r['ratio'])} |")
  return '\n'.join(lines) + '\n'


def report_markdown(report: dict) -> str:
  if 'select_vs_broadcast' in report:
    return select_markdown(report)
  return markdown(report)


def write(output_dir: Optional[str], report: dict) -> None:
  """benchmark.json and benchmark.md into output_dir (nothing if None)."""
  if not output_dir:
    return
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, 'benchmark.json'), 'w') as f:
    json.dump(report, f, indent=2)
  with open(os.path.join(output_dir, 'benchmark.md'), 'w') as f:
    f.write(report_markdown(report))
