#!/usr/bin/env bash
# Attention core by sequence length on a CUDA GPU (issue goals at T=2048 and T=8192 concern the fused
# kernel, which is not written yet; this measures the reference, chunked, SDPA, eager softmax and linear rows).
set -euo pipefail
out=${OUT:-results/gpu}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-src}
python -m hyla bench attention --device cuda --seq-lens 128,256,512,1024,2048,4096,8192 --batch-tokens 16384 \
  --heads 16 --head-dim 64 --csv "$out/attention.csv" --json "$out/attention.json" --plot "$out/attention.png"
