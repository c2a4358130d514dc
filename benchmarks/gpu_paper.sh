#!/usr/bin/env bash
# The paper's Table A1 on a CUDA GPU, in pieces of at most ~9 minutes:
#   1. fuzzy logic, the whole sweep with the authors' grid (12 rows x 4 grid points x 3 seeds);
#   2. SRAVEN softmax, linear, HYLA x 3 seeds (every grid point; lr 1e-3, wd 0.1 first);
#   3. the other SRAVEN rows.
# Every call continues where the last stopped (runs checkpoint and resume; finished runs are skipped), so
# run it again in each device call until it prints "all done". A row's new runs at one seed train as one
# stack (its grid points; attention dropout included: each run draws its own masks); train.fast=true.
# Runs stopped on a CPU (their newest checkpoint committed) continue here: train.fast, compile and the
# attention backend are resumable changes (how a step is computed, not what).
# At the end it packs everything the call produced into one archive (ARCHIVE): records, final weights,
# the newest checkpoint of each unfinished run, results/paper.md and its plots; RESUME_FROM=that archive
# unpacks it first, so a later call (or a CPU) continues from it. It prints the runs left.
#   MINUTES   budget of this call (default 9)         DEVICE  cuda (default) | cpu (the CPU test)
#   STAGES    the stages to run, in this order (default "1-fuzzy 2-sraven-main 3-sraven-rest"); one more,
#             sraven-hyla, is the SRAVEN HYLA row alone (benchmarks/gpu_sraven_verdict.sh runs it first)
#   EXTRA     more overrides for every run, e.g. "train.graph_step=true"
#   ROOT      where the records go (default results/sweeps)
#   FUZZY, SRAVEN   the sweep files (default table_a1_fuzzy, table_a1_sraven; the test uses tiny ones)
#   ARCHIVE   the archive written at the end (default $OUT/gpu_paper_state.tar.gz, else ./gpu_paper_state.tar.gz)
#   RESUME_FROM     an archive of an earlier call, unpacked over the working tree first
#   LATENTS   problems per split for the report's latent-code analysis of finished runs (0: skip)
set -euo pipefail
export PYTHONPATH=${PYTHONPATH:-src}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
root=${ROOT:-results/sweeps}
fuzzy=${FUZZY:-table_a1_fuzzy}
sraven=${SRAVEN:-table_a1_sraven}
budget_s=$(awk "BEGIN { print int(${MINUTES:-9} * 60) }")
archive=${ARCHIVE:-${OUT:-.}/gpu_paper_state.tar.gz}
if [ -n "${RESUME_FROM:-}" ]; then
  tar -xzf "$RESUME_FROM"
  echo "continued from $RESUME_FROM"
fi
# train.fast on every device: on a CPU (the test) torch.compile stands in for the CUDA graph, so the test
# runs what a GPU call runs (dropout included)
overrides=(--override train.fast=true)
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

stages=${STAGES:-1-fuzzy 2-sraven-main 3-sraven-rest}
for name in $stages; do  # every name checked before anything trains
  case $name in
    1-fuzzy|sraven-hyla|2-sraven-main|3-sraven-rest) ;;
    *) echo "unknown stage $name in STAGES (1-fuzzy, sraven-hyla, 2-sraven-main, 3-sraven-rest)" >&2; exit 2 ;;
  esac
done
for name in $stages; do
  case $name in
    1-fuzzy) stage 1-fuzzy "$fuzzy" ;;
    sraven-hyla) stage sraven-hyla "$sraven" --only hyla ;;
    2-sraven-main) stage 2-sraven-main "$sraven" --only softmax,linear,hyla ;;
    3-sraven-rest) stage 3-sraven-rest "$sraven" ;;
  esac
done
left=$( { "$py" -m hyla sweep "$fuzzy" --root "$root" --emit-commands "${overrides[@]}";
          "$py" -m hyla sweep "$sraven" --root "$root" --emit-commands "${overrides[@]}"; } | sed -n 's/.* --out \([^ ]*\) .*/\1/p')
# the archive: records and final weights of every run, the newest checkpoint of each unfinished one,
# and the paper report made from them
names=()
for sweep in "$fuzzy" "$sraven"; do
  names+=("$("$py" -c "import sys; from hyla.train.sweepfile import load_sweep; print(load_sweep(sys.argv[1]).name)" "$sweep")")
done
paper_out=${PAPER_OUT:-results}
paper=()
if "$py" -m hyla report --paper "$fuzzy" "$sraven" --sweep-root "$root" --out "$paper_out" \
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
mkdir -p "$(dirname "$archive")"
tar -czf "$archive" -T "$list"
echo "archive: $archive ($(wc -l < "$list") files); a later call continues with RESUME_FROM=$archive"
rm -f "$list"
pending=$(echo "$left" | grep -c . || true)
if [ "$pending" -gt 0 ]; then
  echo "not done yet ($pending runs left): run this script again"
  echo "$left" | sed 's/^/  left: /'
else
  echo "all done: hyla report --paper --out results"
fi
