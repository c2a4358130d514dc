#!/usr/bin/env bash
# The paper's Table A1 on a CUDA GPU, in the order issue 17 asks for, in pieces of at most ~9 minutes:
#   1. fuzzy logic, the whole sweep with the authors' grid (12 rows x 4 grid points x 3 seeds);
#   2. SRAVEN softmax, linear, HYLA x 3 seeds (every grid point; lr 1e-3, wd 0.1 first);
#   3. the other SRAVEN rows.
# Every call continues where the last stopped (runs checkpoint and resume; finished runs are skipped), so
# run it again in each device call until it prints "all done". Records land in results/sweeps/ (commit them;
# the checkpoints of a stopped run stay in the run folder, so continue on the same machine or copy them).
# Runs with attention dropout (the authors' setup) do not stack; each trains alone with train.fast=true.
# Runs stopped on a CPU (their newest checkpoint committed) continue here: train.fast, compile and the
# attention backend are resumable changes (how a step is computed, not what).
#   MINUTES   budget of this call (default 9)         DEVICE  cuda (default) | cpu (the CPU test)
#   EXTRA     more overrides for every run, e.g. "train.graph_step=true"
#   ROOT      where the records go (default results/sweeps)
#   FUZZY, SRAVEN   the sweep files (default table_a1_fuzzy, table_a1_sraven; the test uses tiny ones)
set -euo pipefail
export PYTHONPATH=${PYTHONPATH:-src}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
root=${ROOT:-results/sweeps}
fuzzy=${FUZZY:-table_a1_fuzzy}
sraven=${SRAVEN:-table_a1_sraven}
budget_s=$(awk "BEGIN { print int(${MINUTES:-9} * 60) }")
overrides=()
if [ "$device" = cuda ]; then overrides+=(--override train.fast=true); fi
for o in ${EXTRA:-}; do overrides+=(--override "$o"); done
start=$(date +%s)

stage() {  # stage NAME SWEEP [--only ROWS]
  local name=$1; shift
  local left_s=$(( budget_s - ($(date +%s) - start) ))
  if [ "$left_s" -lt 20 ]; then echo "budget spent before stage $name"; return 0; fi
  echo "== stage $name ($left_s s left)"
  "$py" -m hyla sweep "$@" --device "$device" --root "$root" \
    --max-minutes "$(awk "BEGIN { print $left_s / 60 }")" "${overrides[@]}"
}

stage 1-fuzzy "$fuzzy"
stage 2-sraven-main "$sraven" --only softmax,linear,hyla
stage 3-sraven-rest "$sraven"
pending=$( { "$py" -m hyla sweep "$fuzzy" --root "$root" --emit-commands "${overrides[@]}";
             "$py" -m hyla sweep "$sraven" --root "$root" --emit-commands "${overrides[@]}"; } | wc -l)
if [ "$pending" -gt 0 ]; then
  echo "not done yet ($pending runs left): run this script again"
else
  echo "all done: hyla report --paper --out results"
fi
