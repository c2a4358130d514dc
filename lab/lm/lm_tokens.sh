#!/usr/bin/env bash
# Validation perplexity against tokens (lab/tables/lm_cpu.md, section 5): softmax, linear and HYLA (and the
# key_normalization=count variants) trained to 9.8M tokens, 8x lm_cpu's 1.2M, with an evaluation every 409,600
# tokens, in two model presets on one data setup (the offline stdlib corpus, 2,000 documents, so that a run sees
# its training tokens about once; BPE vocabulary 1,024; 128 tokens a sequence):
#   tiny:  lm_tiny with 16 heads of 8, batch 16, 4,800 steps, warmup 50
#   wiki:  lm_wiki (the authors' WikiText model), batch 128, 600 steps, warmup 50 (their 1,000 exceeds the run)
#   sweep: lm_tiny with 16 heads of 8 as lm_cpu.md's learning-rate sweep ran it (400 documents, 600 steps)
# Usage: bash lab/lm/lm_tokens.sh tiny|wiki|sweep VARIANT:LR[:count] ...
# e.g.   bash lab/lm/lm_tokens.sh tiny softmax:0.008 linear:0.008 hyla:0.016
# One run after another, one thread (OMP_NUM_THREADS=1 unless set); a killed run resumes from its newest
# checkpoint when the same command is given again; a finished run (model.safetensors) is skipped.
# Then: python lab/lm/lm_tokens.py (the table and the plot).
set -euo pipefail
out=${OUT:-lab/runs/lm_tokens}
hyla=${HYLA:-.venv/bin/hyla}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
part=${1:?usage: lm_tokens.sh tiny|wiki|sweep VARIANT:LR[:count] ...}
shift
data="data.corpus=stdlib data.max_documents=2000 data.vocab_size=1024 data.seq_len=128"
evals="train.eval_size=256 train.eval_batch_size=64"
case $part in
  tiny) args="lm_tiny model.num_heads=16 $data $evals train.steps=4800 train.batch_size=16 train.warmup_steps=50
              train.eval_every=200 train.checkpoint_every=200 train.log_every=100" ;;
  wiki) args="lm_wiki $data $evals train.steps=600 train.batch_size=128 train.warmup_steps=50
              train.eval_every=25 train.checkpoint_every=25 train.log_every=25" ;;
  sweep) args="lm_tiny model.num_heads=16" ;;
  *) echo "part must be one of: tiny, wiki, sweep (got '$part')" >&2; exit 2 ;;
esac
for spec in "$@"; do
  IFS=: read -r variant lr norm <<<"$spec"
  norm=${norm:-none}
  dir="$out/$part/${variant}_$norm/lr$lr"
  if [ -f "$dir/model.safetensors" ]; then echo "finished already: $dir"; continue; fi
  overrides=(model.attention="$variant" train.lr="$lr" name="lm_${part}_${variant}_$norm")
  [ "$norm" != none ] && overrides+=(model.key_normalization="$norm")
  flags=(--out "$dir" --quiet)
  [ -e "$dir/checkpoints/latest" ] && flags+=(--resume)
  # shellcheck disable=SC2086  # $args is a list of overrides
  "$hyla" train $args "${overrides[@]}" "${flags[@]}"
done
