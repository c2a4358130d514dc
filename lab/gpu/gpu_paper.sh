#!/usr/bin/env bash
# The one GPU queue: Table A1 and its witnesses on a CUDA GPU, in device calls of at most ~9 minutes, in the
# developers' stage order (gpu_queue.py beside it holds the stages, the plan and its arithmetic):
#   smoke            (when named) a minute of stacks of both tasks (first run on an H100 on 2026-11-27)
#   throughput       (when named) steps/s against stack size 1, 4, 12, 24 for both tasks, peak memory, and the authors' code's
#                    updates/s (1 and 3 processes) in the same call -> lab/tables/gpu_throughput.{json,md}
#   sraven-selected  SRAVEN HYLA at lr 3e-4, wd 0.3, warmup 1000, seeds 0-2 (CPU runs of these records must be
#                    stopped first, or the records fork: the plan says so loudly)
#   sraven-selected-softmax  softmax there, seed 0
#   sraven-softmax-chosen    softmax's seeds 0-2 at the grid point where its row's seed-0 runs score best in
#                    distribution (the report's rule), once the one above is finished (#48)
#   authors          the authors' code at that point: HYLA seeds 0-2 and softmax seed 0 (gpu_sraven_verdict.sh)
#   fuzzy            the fuzzy-logic Table A1 (hyla sweep table_a1_fuzzy)
#   sraven-rest      the other SRAVEN rows
# (and, for the older drivers, sraven-hyla: the SRAVEN HYLA row; sraven-main: softmax, linear, HYLA).
# A sweep stage trains each row's runs as stacks (the one planner's); each architecture compiles once a call,
# and later calls reuse the compilation from COMPILE_CACHE (carry it; its archive comes back beside the state).
#
#   bash lab/gpu/gpu_paper.sh --plan     (or PLAN=1): print the next call's stacks, runs and projected
#                                               minutes from the last measured rates; needs no GPU
#   run(command="MINUTES=9 bash lab/gpu/gpu_paper.sh", carry=[".gpu_state", ".authors"], timeout_s=600)
#
# Every call continues where the last stopped (runs checkpoint and resume; finished runs are skipped), so
# run it again in each device call until it prints "all done". Runs stopped on a CPU (their newest checkpoint
# committed) continue here: train.fast, compile and the attention backend are resumable changes.
# At the end it packs everything the call produced into one archive (ARCHIVE): records, final weights,
# the newest checkpoint of each unfinished run, lab/paper.md and its plots; RESUME_FROM=that archive
# unpacks it first, so a later call (or a CPU) continues from it. It prints the runs left.
#   MINUTES   budget of this call (default 9)         DEVICE  cuda (default) | cpu (the CPU test)
#   STAGES    the stages to run, in this order (default "sraven-selected sraven-selected-softmax
#             sraven-softmax-chosen authors fuzzy sraven-rest": smoke and throughput, for stacks, run when named)
#   EXTRA     more overrides for every run, e.g. "train.graph_step=true"
#   ROOT      where the records go (default lab/runs)
#   FUZZY, SRAVEN   the sweep files (default table_a1_fuzzy, table_a1_sraven; the test uses tiny ones)
#   COMPILE_CACHE   the compile cache, carried between calls (default .gpu_state/compile_cache; empty: none)
#   AUTHORS_MINUTES the authors stage's minutes (default 3); AUTHORS_STAGE_SEEDS its runs (default "hyla/0 hyla/1
#             hyla/2 softmax/0": gpu_sraven_verdict.sh's AUTHORS_SEEDS); AUTHORS_EXTRA more flags of theirs (a key
#             it names replaces the point's: their parser refuses a key given twice)
#   ARCHIVE   the archive written at the end (default $OUT/gpu_paper_state.tar.gz, else ./gpu_paper_state.tar.gz)
#   RESUME_FROM     an archive of an earlier call (or the name of its .part-NN files), unpacked over the tree first
#   PART_MIB  an archive over this many MiB is split into ARCHIVE.part-000, -001, ... (default 15; archive.sh)
#   LATENTS   problems per split for the report's latent-code analysis of finished runs (0: skip)
#   MAX_STACK runs a stack holds (default 1: each run alone; a stack of 3 SRAVEN runs on an H100 trained 372
#             run-steps/s, one run alone 567: lab/tables/gpu_queue/2026-11-27)
#   REPORT    1 (default): lab/paper.md in the archive | 0: none (minutes of CPU on the device; make it here)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH=${PYTHONPATH:-src}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
root=${ROOT:-lab/runs}
fuzzy=${FUZZY:-table_a1_fuzzy}
sraven=${SRAVEN:-table_a1_sraven}
minutes=${MINUTES:-9}
budget_s=$(awk "BEGIN { print int($minutes * 60) }")
archive=${ARCHIVE:-${OUT:-.}/gpu_paper_state.tar.gz}
. "$here/archive.sh"
stack=(${MAX_STACK:+--max-stack "$MAX_STACK"})  # unset: hyla sweep's default (each run alone)
stages=${STAGES:-$("$py" "$here/gpu_queue.py" stages)}
plan() {
  "$py" "$here/gpu_queue.py" plan --minutes "$minutes" --stages "$stages" --root "$root" --fuzzy "$fuzzy" \
    --sraven "$sraven" "${stack[@]}"
}
case "${1:-}" in
  --plan) plan; exit $? ;;
  "") ;;
  *) echo "usage: $0 [--plan]" >&2; exit 2 ;;
esac
if [ "${PLAN:-0}" = 1 ]; then plan; exit $?; fi
# every name checked before anything trains; the error names the stage and the allowed ones
"$py" "$here/gpu_queue.py" check $stages || exit 2
if [ -n "${RESUME_FROM:-}" ]; then unpack_archive "$RESUME_FROM"; fi
# one compilation per architecture a call; a later call reads it back from the carried cache
cache=${COMPILE_CACHE-.gpu_state/compile_cache}
if [ -n "$cache" ]; then
  mkdir -p "$cache"
  export TORCHINDUCTOR_CACHE_DIR=$PWD/$cache/inductor TRITON_CACHE_DIR=$PWD/$cache/triton
fi
# train.fast on every device: on a CPU torch.compile stands in for the CUDA graph (dropout included); the
# script's CPU test turns it off with EXTRA (compiling on a CPU has tests of its own)
overrides=(--override train.fast=true)
# and on CUDA the whole step as one graph: one SRAVEN run trained 567 steps/s on an H100 with it, 33 without
# (lab/tables/gpu_queue/2026-11-27); a CPU refuses it
if [ "$device" = cuda ]; then overrides+=(--override train.graph_step=true); fi
for o in ${EXTRA:-}; do overrides+=(--override "$o"); done
start=$(date +%s)
left_s() { echo $(( budget_s - ($(date +%s) - start) )); }

sweep_stage() {  # sweep_stage NAME: the stage's sweep, rows and filters from the queue's table
  local name=$1 args file out rc=0
  out=$("$py" "$here/gpu_queue.py" args "$name" --root "$root" --fuzzy "$fuzzy" --sraven "$sraven") || rc=$?
  if [ "$rc" = 3 ]; then echo "$out"; return 0; fi  # its grid point is not chosen yet: nothing to train
  # a stage that cannot say what to train must not cost the call's archive: the queue goes on
  if [ "$rc" != 0 ]; then echo "stage $name: no arguments (above); the queue goes on"; return 0; fi
  mapfile -t args <<< "$out"
  case ${args[0]} in fuzzy) file=$fuzzy ;; sraven) file=$sraven ;; esac
  sweep() {
    "$py" -m hyla sweep "$file" "${args[@]:1}" --device "$device" --root "$root" \
      --max-minutes "$(awk "BEGIN { print $(left_s) / 60 }")" "${stack[@]}" "${overrides[@]}" "$@"
  }
  if sweep; then return 0; fi
  # a step that cannot be captured must not cost the call: the stage goes on without the whole-step graph
  case " ${overrides[*]} " in *" train.graph_step=true "*) ;; *) return 1 ;; esac
  echo "stage $name failed with train.graph_step=true (above): again without it"
  sweep --override train.graph_step=false
}

smoke() {  # a stack of each task at the paper's sizes for a few hundred steps: does the stacked step run here?
  local task
  for task in fuzzy_logic sraven; do
    "$py" -m hyla train "$task" train.fast=true train.steps=300 train.eval_every=300 train.log_every=100 \
      "${EXTRA_ARR[@]}" --seeds 0,1,2 --device "$device" --out "lab/tables/gpu_smoke/$task" --quiet
  done
}

throughput() {  # steps/s against stack size, peak memory, and the authors' code in the same call
  local task r out=lab/tables/gpu_throughput
  mkdir -p "$out"
  for task in fuzzy_logic sraven; do
    for r in ${SIZES:-1 4 12 24}; do
      "$py" -m hyla bench train --task "$task" --variants hyla --seeds "$r" --steps 200 --repeats 2 \
        --device "$device" --fast --override train.graph_step=true --json "$out/${task}_stack$r.json" || true
    done
  done
  local n
  for n in 1 3; do
    AUTHORS_SEEDS=$(seq -s ' ' 0 $(( n - 1 ))) AUTHORS_MINUTES=${THEIR_MINUTES:-1} STAGES=none MINUTES=$(( ${THEIR_MINUTES:-1} + 2 )) \
      AUTHORS_LOGS="$out/authors_$n" ARCHIVE="$out/authors_$n.tar.gz" DEVICE="$device" PYTHON="$py" \
      bash "$here/gpu_sraven_verdict.sh" > "$out/authors_$n.log" 2>&1 || true
    grep -h "train_steps_per_sec this call" "$out/authors_$n.log" || true
  done
  "$py" "$here/throughput_table.py" "$out" lab/tables/gpu_throughput
}

authors() {  # their driver at the selected point (the queue's SELECTED), beside our sraven-selected runs
  local point logs
  point=$("$py" "$here/gpu_queue.py" authors-flags --given="${AUTHORS_EXTRA:-}") || return 1
  logs=$("$py" "$here/gpu_queue.py" authors-logs) || return 1
  AUTHORS_SEEDS=${AUTHORS_STAGE_SEEDS:-hyla/0 hyla/1 hyla/2 softmax/0} AUTHORS_MINUTES=${AUTHORS_MINUTES:-3} STAGES=none \
    MINUTES=$(awk "BEGIN { print $(left_s) / 60 }") AUTHORS_LOGS="$logs" \
    AUTHORS_EXTRA="$point ${AUTHORS_EXTRA:-}" \
    ARCHIVE="${archive%.tar.gz}_authors.tar.gz" DEVICE="$device" PYTHON="$py" bash "$here/gpu_sraven_verdict.sh"
}

read -r -a EXTRA_ARR <<< "${EXTRA:-}"
plan || true
for name in $stages; do
  if [ "$(left_s)" -lt 20 ]; then echo "budget spent before stage $name"; continue; fi
  echo "== stage $name ($(left_s) s left)"
  case $name in
    smoke) if [ -f lab/tables/gpu_throughput.json ]; then echo "stacks measured already"; else smoke; fi ;;
    throughput) if [ -f lab/tables/gpu_throughput.json ]; then echo "measured already"; else throughput; fi ;;
    authors) authors || echo "the authors stage failed (above); the queue goes on" ;;
    *) sweep_stage "$name" ;;
  esac
done
# the archive: records and final weights of every run, the newest checkpoint of each unfinished one,
# and the paper report made from them
names=() left=""
while read -r kind value; do
  case $kind in sweep) names+=("$value") ;; left) left+="$value"$'\n' ;; esac
done < <("$py" "$here/gpu_queue.py" left --root "$root" --fuzzy "$fuzzy" --sraven "$sraven")
paper_out=${PAPER_OUT:-lab}
paper=()
if [ "${REPORT:-1}" = 1 ] && "$py" -m hyla report --paper "$fuzzy" "$sraven" --sweep-root "$root" --out "$paper_out" \
    ${LATENTS:+--latents "$LATENTS"} >/dev/null; then
  paper=("$paper_out/paper.md" "$paper_out/paper")
fi
list=$(mktemp)
for name in "${names[@]}"; do
  dir="$root/$name"
  [ -d "$dir" ] || continue
  find "$dir" -path '*/checkpoints' -prune -o -path '*/tb' -prune -o -type f ! -name '*.log' -print >> "$list"
  for run in "$dir"/*/; do
    case " $(echo $left) " in *" ${run%/} "*) ;; *) continue ;; esac
    newest=$(cat "$run/checkpoints/latest" 2>/dev/null) || continue
    echo "${run}checkpoints/latest" >> "$list"
    find "${run}checkpoints/$newest" -type f >> "$list"
  done
done
for f in "${paper[@]}"; do [ -e "$f" ] && find "$f" -type f >> "$list"; done
pack_archive "$archive" "$list"
rm -f "$list"
if [ -n "$cache" ] && [ -n "$(ls -A "$cache" 2>/dev/null)" ]; then
  tar -czf "${archive%.tar.gz}_compile_cache.tar.gz" "$cache"
  echo "compile cache: ${archive%.tar.gz}_compile_cache.tar.gz: unpack it here and carry $cache in the next call"
fi
pending=$(echo "$left" | grep -c . || true)
if [ "$pending" -gt 0 ]; then
  echo "not done yet ($pending runs left): run this script again"
  echo "$left" | sed 's/^/  left: /'
else
  echo "all done: python lab/paper.py"
fi
