#!/usr/bin/env bash
# Ours on one GPU: SRAVEN HYLA at the paper's grid point (src/hyla/configs/sraven.yaml: lr 1e-3, wd 0.1, warmup 1000),
# the seeds SEEDS (sharing seed 0's held-out tasks) trained together as one stacked model for MINUTES, to count how many leave the first plateau
# (about 14% OOD) and when. Theirs: 3 of 5 runs left it by 62,500 updates (lab/tables/gpu_sraven_verdict/README.md);
# ours has one finished run, which did not.
#
# The device call (nothing to prepare; the working tree carries the code):
#   run(command="MINUTES=6 bash lab/gpu/gpu_plateau.sh", timeout_s=480)
# timeout_s must exceed MINUTES * 60 by a minute (start, the stop's checkpoint, the packing).
#
# At the deadline the stack gets SIGTERM, saves a checkpoint and exits; a later call in the same session continues
# it from the returned archive's checkpoints only if they came back (CHECKPOINTS=1: about 4.9 MB per seed, under the
# 16 MiB a file for 3 seeds or fewer). By default only each seed's config.yaml and metrics.jsonl come back, in
# $OUT/gpu_plateau.tar.gz: the OOD curve is what the question needs.
#
# Environment (defaults in brackets):
#   MINUTES [6; none when STOP_AT_STEP is given alone]  SEEDS [3,4,5,6,7,8,9,10]  DEVICE [cuda] | cpu (the CPU
#     test)  PYTHON [python3]
#   STOP_AT_STEP: stop the stack with a checkpoint at this step (hyla train --stop-at-step): a stop on a count,
#     what the CPU test uses instead of a budget a busy machine may miss
#   RUN [lab/tables/gpu_plateau/hyla-seeds<SEEDS with - for ,>]: the stacked run's directory (RUN/seedN per seed);
#     resumed when it has a checkpoint
#   EXTRA: more overrides, e.g. "train.tf32=false" (full float32 matmuls; the default, TF32, is what JAX does on
#     these GPUs, and what the authors' runs had), or the CPU test's tiny model
#   CHECKPOINTS [0]: 1 packs each seed's newest checkpoint too    ARCHIVE [$OUT/gpu_plateau.tar.gz]
set -euo pipefail
export PYTHONPATH=${PYTHONPATH:-src}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
seeds=${SEEDS:-3,4,5,6,7,8,9,10}
run=${RUN:-lab/tables/gpu_plateau/hyla-seeds${seeds//,/-}}
minutes=${MINUTES:-}
if [ -z "$minutes" ] && [ -z "${STOP_AT_STEP:-}" ]; then minutes=6; fi
budget_s=$(awk "BEGIN { print int(${minutes:-0} * 60) }")  # 0: no deadline
archive=${ARCHIVE:-${OUT:-.}/gpu_plateau.tar.gz}
read -r -a extra <<< "${EXTRA:-}"

resume=()
if compgen -G "$run/seed*/checkpoints/latest" >/dev/null; then resume=(--resume); fi
stop=()
if [ -n "${STOP_AT_STEP:-}" ]; then stop=(--stop-at-step "$STOP_AT_STEP"); fi
limit=()
if [ "$budget_s" -gt 0 ]; then limit=(timeout -s TERM "$budget_s"); fi
echo "== ours: SRAVEN HYLA seeds $seeds as one stack on $device, ${minutes:+$budget_s s}${stop[*]:+ to step $STOP_AT_STEP}${resume:+, resumed}; extra: ${extra[*]:-none}"
start=$(date +%s)
rc=0
# train.fast: the CUDA graph on a GPU, torch.compile on a CPU (the test runs what a GPU call runs).
# data.split_seed=0: every seed holds out seed 0's tasks, so that the seeds train as one stack (with the paper's
# split, which follows the seed, they would train one after another); the batches, the initial draw and the
# dropout masks still follow each seed.
"${limit[@]}" "$py" -m hyla train sraven model.attention=hyla train.fast=true data.split_seed=0 \
  "${extra[@]}" \
  --seeds "$seeds" --device "$device" --out "$run" --quiet "${resume[@]}" "${stop[@]}" || rc=$?
echo "== trained for $(( $(date +%s) - start )) s (exit $rc: 0 finished or stopped at STOP_AT_STEP, 124 stopped at the deadline; both with a checkpoint)"

# the OOD accuracy of each seed at each evaluation, and the step each reached
"$py" - "$run" <<'PY'
import sys
from pathlib import Path

from hyla.train.run.folder import has_record, read_run

for seed_dir in sorted(Path(sys.argv[1]).glob("seed*"), key=lambda p: int(p.name[4:])):
    rows = read_run(seed_dir).metrics if has_record(seed_dir) else []
    ood = [f"{r['step']}:{100 * r['acc']:.1f}" for r in rows if r.get("split") == "ood"]
    last = max((r["step"] for r in rows), default=0)
    print(f"{seed_dir.name}: logged to step {last}; OOD % at each evaluation: {' '.join(ood) or '-'}")
PY

files=()
for d in "$run"/seed*; do
  for f in config.yaml metrics.jsonl; do [ -f "$d/$f" ] && files+=("$d/$f"); done
  if [ "${CHECKPOINTS:-0}" = 1 ] && [ -f "$d/checkpoints/latest" ]; then
    files+=("$d/checkpoints/latest" "$d/checkpoints/$(cat "$d/checkpoints/latest")")
  fi
done
if [ "${#files[@]}" -eq 0 ]; then echo "nothing to pack: no run directory under $run" >&2; exit 1; fi
tar -czf "$archive" "${files[@]}"
echo "archive: $archive ($(stat -c %s "$archive") bytes, ${#files[@]} paths)"
[ "$rc" = 0 ] || [ "$rc" = 124 ]
