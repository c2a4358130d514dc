#!/usr/bin/env bash
# Measure the training-throughput goals on a CUDA GPU (run from the repository root on the GPU machine).
# Writes JSON under ${OUT:-lab/tables/gpu}. Goals (one H100): HYLA SRAVEN 156,250 steps <= 5 min (>= 521 steps/s),
# three stacked seeds <= 8 min (>= 326 stacked steps/s), fuzzy logic 50k steps <= 1 min (>= 833 steps/s).
# --time-eval adds the config's evaluations to the projected wall time; --check-syncs fails on host syncs.
# train.graph_step=true captures the whole step as one CUDA graph, the lone run's and the stack's.
# Results of the first run: lab/tables/gpu_h100.md.
set -euo pipefail
out=${OUT:-lab/tables/gpu}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-src}
${PYTHON:-python3} -m hyla bench train --task sraven --variants hyla --seeds 3 --steps 200 --device cuda \
  --check-syncs --json "$out/train_sraven_eager_hyla.json"
${PYTHON:-python3} -m hyla bench train --task sraven --variants softmax,hyla --seeds 3 --steps 200 --repeats 2 \
  --device cuda --fast --time-eval --override train.graph_step=true --json "$out/train_sraven_graph.json"
${PYTHON:-python3} -m hyla bench train --task fuzzy_logic --variants softmax,hyla --seeds 3 --steps 200 --repeats 2 \
  --device cuda --fast --time-eval --override train.graph_step=true --json "$out/train_fuzzy_graph.json"
${PYTHON:-python3} -m hyla bench step --task sraven --variants softmax,linear,hyla --device cuda --json "$out/step_sraven.json"
