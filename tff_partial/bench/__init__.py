"""Measuring methods side by side (the library behind `scripts.benchmark`).

One concern per module: `configs` (configurations and presets), `cohorts`
(sampled clients and their client values on TFF's and this package's data
paths), `rounds` (interleaved round timing), `references` (centralized Keras
limit, Keras with the TFF data path, the tf.function floor),
`client_memory` (the memory column), `scaling` (cost against cohort size),
`report` (ratios and tables), `machine` (CPU, AVX-512, oneDNN, CPU seconds).
"""
