#!/usr/bin/env bash
# One window of #38 part 3's trajectory comparison: ours and the authors' SRAVEN HYLA training from the same
# state on the same batches in float64, compared after every update, with the control (ours on the direct
# form of the attention) beside it. The steps are lab/authors/trajectory_sraven.py's; this only chains them.
#
#   lab/authors/trajectory_windows.sh NAME START STEPS DROPOUT [nodirect|onlydirect]
#
# START: `scratch` (our seed-0 initial weights), a checkpoint folder (RUN/checkpoints/step-N), or `rerun:N`
# (our seed-0 paper config trained to update N first, for a checkpoint there); DROPOUT: 1 hands our keep-masks
# to their model, 0 switches attention dropout off; `nodirect` skips the control, `onlydirect` runs only the
# control (beside a window run earlier with `nodirect`, in the same $WORK/NAME). Records go to
# lab/tables/side_by_side/trajectory_sraven_hyla_f64_NAME[_dropout]_{ours_vs_theirs_f64lr,ours_vs_ours_direct}.json
# and the .npz files to $WORK/NAME (default /tmp/traj). Their code runs in its own venv:
# AUTHORS_CODE (default /work/authors/code) and AUTHORS_VENV (default /work/authors/venv).
set -euo pipefail
name=$1 start=$2 steps=$3 dropout=$4 control=${5:-direct}
repo=$(cd "$(dirname "$0")/../.." && pwd)
py=${PY:-$repo/.venv/bin/python}
AUTHORS_CODE=${AUTHORS_CODE:-/work/authors/code} AUTHORS_VENV=${AUTHORS_VENV:-/work/authors/venv}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$repo/src
D=${WORK:-/tmp/traj}/$name
R=$repo/results/side_by_side
mkdir -p "$D"
args=(--steps "$steps" --float64 --out "$D")
tag=f64_$name
[ "$dropout" = 1 ] && args+=(--dropout) && tag=${tag}_dropout
cd "$repo"
if [[ "$start" == rerun:* ]]; then
  at=${start#rerun:}
  ATEN_CPU_CAPABILITY=avx2 HYLA_CPU_MARCH=x86-64-v3 "$py" -m hyla train sraven seed=0 --out "$D/run" \
    --stop-at-step "$at" --quiet > "$D/run.log" 2>&1
  args+=(--start "$D/run/checkpoints/step-$(printf %09d "$at")")
elif [ "$start" != scratch ]; then
  args+=(--start "$start")
fi
if [ "$control" != onlydirect ]; then
  "$py" lab/authors/trajectory_sraven.py ours "${args[@]}" > "$D/ours.log" 2>&1
  XLA_FLAGS=--xla_disable_hlo_passes=onednn-matmul-rewriter PYTHONPATH=$AUTHORS_CODE \
    "$AUTHORS_VENV/bin/python" lab/authors/trajectory_sraven.py theirs --float64-schedule --name theirs_f64lr \
    --out "$D" > "$D/theirs.log" 2>&1
  "$py" lab/authors/trajectory_sraven.py compare --out "$D" --b theirs_f64lr \
    --json "$R/trajectory_sraven_hyla_${tag}_ours_vs_theirs_f64lr.json" > "$D/cmp_theirs.txt"
  head -4 "$D/cmp_theirs.txt"
fi
[ "$control" = nodirect ] && exit 0
"$py" lab/authors/trajectory_sraven.py ours "${args[@]}" --backend direct --name direct > "$D/direct.log" 2>&1
"$py" lab/authors/trajectory_sraven.py compare --out "$D" --b direct \
  --json "$R/trajectory_sraven_hyla_${tag}_ours_vs_ours_direct.json" > "$D/cmp_direct.txt"
head -4 "$D/cmp_direct.txt"
