#!/usr/bin/env bash
# Attention core by sequence length on a CUDA GPU, bf16, H=16, d_head=64, B*T fixed (the fused-kernel issue's
# goals: at T=2048 fused HYLA forward+backward <= 2x SDPA and >= 5x faster than the direct form; at T=8192
# peak memory within 1.2x of SDPA's). Then the kernel's launch configurations at T=2048 and the kernel
# tests on the GPU. Results of the first run: lab/tables/gpu_h100.md.
set -euo pipefail
out=${OUT:-lab/tables/gpu}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-src}
${PYTHON:-python3} -m hyla bench attention --device cuda --seq-lens 128,256,512,1024,2048,4096,8192 --batch-tokens 16384 \
  --heads 16 --head-dim 64 --variants hyla_direct,hyla_chunked,hyla_fused,sdpa_softmax,eager_softmax,linear \
  --csv "$out/attention_cuda.csv" --json "$out/attention_cuda.json" --plot "$out/attention_cuda.png"
${PYTHON:-python3} lab/gpu/gpu_kernel_probe.py --json "$out/kernel_probe.json"
${PYTHON:-python3} -m pytest -q -m kernel tests/attention/test_kernels.py | tee "$out/kernel_tests.txt"
