#!/bin/bash
# Client loop (dataset.reduce vs iterator) per task on both oneDNN paths, as
# measured on 2026-11-25 (quiet 2-core AMD EPYC, no AVX-512). From the repository
# root: bash docs/benchmark_results/client_loop_no_avx512/run.sh [OUT]; then
# python3 docs/benchmark_results/client_loop_no_avx512/ratios.py OUT
cd "$(dirname "$0")/../../.."
OUT=${1:-/tmp/client_loop}
mkdir -p $OUT
run() {  # task dnn extra flags...
  t=$1; p=$2; shift 2
  d=$OUT/${t}_dnn$p
  [ -f $d/benchmark.md ] && return
  mkdir -p $d
  TF_ENABLE_ONEDNN_OPTS=$p timeout 1500 .venv/bin/python -m scripts.benchmark --task=$t "$@" \
    --clients_per_round=10 --benchmark_configs=tff_fedavg --benchmark_config=fedavg_reduce:fedavg:client_loop=reduce --benchmark_config=fedavg_iterator:fedavg:client_loop=iterator \
    --benchmark_rounds=7 --benchmark_keras=false --benchmark_memory=false --benchmark_eval=false \
    --output_dir=$d > $d/log 2>&1
  echo "$(date +%T) $t dnn$p rc=$?" >> $OUT/progress
}
LEAF="--data_source=leaf --data_dir=../shared/data/femnist_leaf_sample.tar.xz"
H5="--data_source=h5 --data_dir=../shared/data/shakespeare_tff_h5.tar.xz --client_batch_size=20 --client_max_batches=10"
for p in 0 1; do
  run cifar10_resnet18 $p --data_source=jpeg --data_dir=../shared/data/cifar10_jpg.tar.xz --cifar10_width=16 --client_batch_size=20
  run emnist_cnn_gn $p $LEAF --client_batch_size=20
  run emnist_cnn $p $LEAF --client_batch_size=20
  run emnist_2nn $p $LEAF --client_batch_size=20
  run shakespeare_char $p $H5
  run shakespeare_word $p $H5
  run stackoverflow_nwp $p --data_source=synthetic --client_max_batches=10
  run stackoverflow_tags $p --data_source=synthetic --client_max_batches=10
done
echo done >> $OUT/progress
