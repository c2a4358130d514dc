#!/usr/bin/env bash
# Language-model comparison on CPU (lab/tables/lm_cpu.md), lm_tiny at equal tokens, in four parts:
# 1. softmax vs linear vs HYLA, SEEDS (one after another), for each attention split in HEADS of the same
#    total width (qk = v = 128): 4 heads of 32 (the lm-tiny preset), 16 heads of 8 (the head size of the
#    paper code's WikiText model, configs/wiki.py: 16 heads, qk = v = 128 in total), 32 heads of 4.
#    One report per split.
# 2. learning rates: seed 0 of each variant at the rates in LRS (lm_tiny's is 2e-3), LR_HEADS heads.
# 3. the paper's ablations in ABLATIONS, seed 0, ABLATION_HEADS heads, beside linear and HYLA.
# 4. SEEDS at chosen rates: BEST lists attention:lr pairs (from part 2), BEST_HEADS heads. One report.
# Set LRS=, ABLATIONS= or BEST= (empty) to skip a part. About 100 minutes on the 2-core CPU machine.
# EXTRA: more KEY=VALUE overrides for every run.
set -euo pipefail
out=${OUT:-runs/lm_cpu}
hyla=${HYLA:-.venv/bin/hyla}
seeds=${SEEDS:-0,1,2}
train() {  # attention heads out_dir extra-args...
  local v=$1 heads=$2 dir=$3
  shift 3
  "$hyla" train lm_tiny model.attention=$v model.num_heads=$heads name=lm_tiny_${v}_h$heads ${EXTRA:-} \
    --out "$dir" --quiet "$@"
}
for heads in ${HEADS-4 16 32}; do
  for v in softmax linear hyla; do
    train $v $heads "$out/h$heads/$v" --seeds "$seeds"
  done
  "$hyla" report "$out/h$heads"/*/seed* --out "$out/h$heads/report" --latents 0
done
lrs=${LRS-0.001 0.004 0.008 0.016}
if [ -n "$lrs" ]; then
  heads=${LR_HEADS:-16}
  mkdir -p "$out/lr"
  echo "grid: {train.lr: [${lrs// /, }]}" > "$out/lr/sweep.yaml"
  for v in softmax linear hyla; do
    train $v $heads "$out/lr/$v" --sweep "$out/lr/sweep.yaml"
  done
  "$hyla" report "$out/lr"/*/lr* "$out/h$heads"/*/seed0 --out "$out/lr/report" --latents 0
fi
ablations=${ABLATIONS-linear_rmshead hyla_no_rmshead hyla_no_nonlinearity hyla_softmax}
if [ -n "$ablations" ]; then
  heads=${ABLATION_HEADS:-16}
  for v in $ablations; do
    train $v $heads "$out/ablations/h$heads/$v" --seeds 0
  done
  "$hyla" report "$out/ablations/h$heads"/*/seed0 "$out/h$heads"/{linear,hyla}/seed0 \
    --out "$out/ablations/h$heads/report" --latents 0
fi
best=${BEST-softmax:0.008 linear:0.008 hyla:0.008 hyla:0.016}
if [ -n "$best" ]; then
  heads=${BEST_HEADS:-16}
  for pair in $best; do
    v=${pair%%:*} lr=${pair#*:}
    EXTRA="${EXTRA:-} train.lr=$lr" train $v $heads "$out/best/h$heads/${v}_lr$lr" --seeds "$seeds"
  done
  "$hyla" report "$out/best/h$heads"/*/seed* --out "$out/best/h$heads/report" --latents 0
fi
