#!/usr/bin/env bash
# Language-model comparison on CPU (results/lm_cpu.md): softmax vs linear vs HYLA on lm_tiny at equal
# tokens, SEEDS trained together (`--seeds`), for each attention split in HEADS of the same total width
# (qk = v = 128): 4 heads of 32 (the lm-tiny preset) and 16 heads of 8 (the head size of the paper code's
# WikiText model, configs/wiki.py: 16 heads, qk = v = 128 in total). One `hyla report` per split.
# About 30 minutes on the 2-core CPU machine. EXTRA: more KEY=VALUE overrides for every run.
set -euo pipefail
out=${OUT:-runs/lm_cpu}
hyla=${HYLA:-.venv/bin/hyla}
seeds=${SEEDS:-0,1,2}
for heads in ${HEADS:-4 16}; do
  for v in softmax linear hyla; do
    "$hyla" train lm_tiny model.attention=$v model.num_heads=$heads name=lm_tiny_${v}_h$heads ${EXTRA:-} \
      --seeds "$seeds" --out "$out/h$heads/$v" --quiet
  done
  "$hyla" report "$out/h$heads"/*/seed* --out "$out/h$heads/report" --latents 0
done
