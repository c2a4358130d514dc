#!/usr/bin/env bash
# SRAVEN HYLA on one GPU, theirs then ours (issue #38 part 5), in resumable device calls.
#
# The device call (after `lab/gpu/gpu_sraven_verdict.sh prepare` here, once):
#   run(command="MINUTES=8.5 bash lab/gpu/gpu_sraven_verdict.sh", carry=[".authors"], timeout_s=600)
# A call resumes each run of theirs from its resume.pkl in the working tree; the newest of each is committed
# (lab/tables/gpu_sraven_verdict/README.md), so a later session's call needs nothing more. Within one session, a
# second call continues from the archive the last one returned (copy its file, or its .part-NNN files, from
# files_at into the ignored folder .gpu_state/ first), with MINUTES a minute and a half under the device
# time left, e.g.:
#   run(command="MINUTES=2.5 RESUME_FROM=.gpu_state/gpu_sraven_verdict.tar.gz bash lab/gpu/gpu_sraven_verdict.sh",
#       carry=[".authors", ".gpu_state"], timeout_s=240)
# timeout_s must exceed MINUTES * 60 by a minute (the unpacking, the setup and the packing are outside it).
# What travels: the working tree (68 MB of tracked files on 2026-11-28, most of them run checkpoints and weights:
# over the 64 MiB with .authors; lab/tables/gpu_queue/2026-11-28/README.md says how that call left some out), .authors
# (~3 MB) and the archive (~15 MB with three states of theirs: 3 x 4.85 MB of params and Adam moments, 402,824
# parameters, little compressible).
# A part that fails (their setup, a run of theirs, ours) is reported; the call goes on, packs what it has and
# exits 1.
#
# Each call spends its MINUTES in this order:
#   1. the authors' code (their run.py's setup and Experiment.run loop through lab/authors/authors_sraven_resumable.py;
#      configs/raven.py unchanged: linear_hypatt, lr 1e-3, wd 0.1, warmup 1000, the full 156,250-step schedule),
#      seeds AUTHORS_SEEDS (0 1 2, and the swaps 0:1 1:0) as concurrent processes on the one GPU, evaluating every 2,500 steps on
#      12,800 problems per split, logging every 250; stopped with SIGTERM (they save resume.pkl and exit) when
#      AUTHORS_MINUTES (default: the whole call) are spent; their steps/s (train_steps_per_sec in event.log) is
#      printed;
#   2. what is left: ours, lab/gpu/gpu_paper.sh with STAGES (default sraven-hyla: the SRAVEN HYLA row,
#      every grid point and seed, as stacked runs).
# RESERVE_S (60) seconds of MINUTES are kept for the stops, the saves and the packing.
#
# At the end it packs one archive ARCHIVE (default $OUT/gpu_sraven_verdict.tar.gz): their run dirs (event.log,
# stdout.log, resume.pkl; config.pkl and a `done` file once a schedule is finished; state.pkl, a copy of the
# final state in resume.pkl, is left out), their JAX compilation cache, our records (what gpu_paper.sh packs)
# and this call's logs; only files that this call wrote or unpacked: what it left untouched is in the working
# tree it ran on. Over PART_MIB (15) MiB it is split into ARCHIVE.part-000, -001, ... (what comes back from a
# device call is at most 16 MiB a file). RESUME_FROM=ARCHIVE (the file or its parts) unpacks it first.
#
# Their code and the Python packages it needs beyond the GPU machine's travel in the ignored folder .authors/
# (carry it): `prepare` (here, with the network) copies their checkout (AUTHORS_SRC [/work/authors/code]; on a fresh
# machine, where there is none: their pinned commit from a bare git dir, AUTHORS_MIRROR) into .authors/code and
# downloads wheels into .authors/wheels; each call installs, into .authors/site-cpXY, only those that its
# Python cannot import (pip install --no-index --no-deps --target). ml_collections: their pin 0.1.1 imports
# `imp`, gone in Python 3.12 (the GPU machine's), where 1.1.0 (same API) is installed instead. Their runs get
# JAX_THREEFRY_PARTITIONABLE=false: a newer JAX (the GPU machine has 0.11) draws other random bits from the same
# key than their JAX 0.4.30 did; with it, their initialisation and data stream are those of their pinned JAX.
# (Checked on a CPU with the GPU machine's versions, Python 3.12, jax 0.11.2, flax 0.12.12, optax 0.2.8: the same
# metrics as their pinned venv, to float rounding, and the stop and resume of lab/tests/test_authors_resumable.py.)
#
# Subcommands: (none) a call as above | prepare (here) | site (only install the missing wheels).
# Environment (defaults in brackets):
#   MINUTES [9]  AUTHORS_MINUTES [all]  RESERVE_S [60]  DEVICE [cuda] | cpu (the CPU test: JAX_PLATFORMS=cpu, ours on cpu)
#   PYTHON [python3]: ours, with PYTHONPATH=src     AUTHORS_PYTHON [$PYTHON]: theirs, with PYTHONPATH=AUTHORS_SITE
#   AUTHORS_CODE [.authors/code]  AUTHORS_WHEELS [.authors/wheels]  AUTHORS_SITE [.authors/site-cpXY]
#   AUTHORS_SEEDS ["0 1 2 0:1 1:0"; empty: ours only; S:I = data of seed S, initial state of seed I; V/S = their
#     model of our variant V (hyla, softmax, linear; default hyla), e.g. "hyla/0 softmax/0"]
#   AUTHORS_LOGS [lab/tables/gpu_sraven_verdict/authors] (relative)
#   JAX_DEFAULT_MATMUL_PRECISION [unset: JAX's default, TF32 matmuls on an A100/H100 and on the paper's RTX cards]:
#     float32 runs theirs in full float32, as on a CPU (noted in each run's stdout.log; give such runs their own
#     AUTHORS_LOGS, e.g. lab/tables/gpu_sraven_verdict/authors_float32)
#   EVAL_EVERY [2500]  LOG_EVERY [250]  EVAL_PROBLEMS [12800]  SAVE_EVERY_MINUTES [2]  AUTHORS_GRACE_S [120]
#   AUTHORS_EXTRA: more flags for their runs (the CPU test shrinks the model and the schedule with them)
#   JAX_CACHE [lab/tables/gpu_sraven_verdict/jax_cache; empty: none]
#   STAGES [sraven-hyla; none: theirs only], and for gpu_paper.sh: ROOT, FUZZY, SRAVEN, EXTRA, LATENTS [0], PAPER_OUT
#   [lab/tables/gpu_sraven_verdict/paper]
#   ARCHIVE, PART_MIB [15], RESUME_FROM
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=${PYTHON:-python3}
apy=${AUTHORS_PYTHON:-$py}
code=${AUTHORS_CODE:-.authors/code}
wheels=${AUTHORS_WHEELS:-.authors/wheels}
verdict=lab/tables/gpu_sraven_verdict
logs=${AUTHORS_LOGS:-$verdict/authors}
read -r -a seeds <<< "${AUTHORS_SEEDS-0 1 2 0:1 1:0}"

prepare() {  # here: their code and the wheels into .authors/ (git-ignored)
  local src=${AUTHORS_SRC:-/work/authors/code} mirror=${AUTHORS_MIRROR:-/work/.mirror/smonsays+hypernetwork-attention/repo}
  local commit=${AUTHORS_COMMIT:-af9805fc33f2009e56b46730aaeff37194f66970}  # the commit every record of theirs ran
  local pip=("${AUTHORS_VENV:-/work/authors/venv}/bin/pip")
  [ -x "${pip[0]}" ] || pip=("$py" -m pip)  # any pip: it only builds and downloads wheels
  rm -rf .authors/code .authors/wheels
  mkdir -p .authors/code .authors/wheels
  if [ -f "$src/run.py" ]; then
    tar -C "$src" --exclude=.git --exclude=__pycache__ -cf - . | tar -C .authors/code -xf -
    git -C "$src" rev-parse HEAD > .authors/code/COMMIT 2>/dev/null || true
  elif git --git-dir="$mirror" cat-file -e "$commit^{commit}" 2>/dev/null; then  # a fresh machine: a bare copy
    git --git-dir="$mirror" archive "$commit" | tar -C .authors/code -xf -
    echo "$commit" > .authors/code/COMMIT
  else
    echo "no authors' code: neither a checkout at $src (AUTHORS_SRC) nor commit $commit in a git dir at $mirror" \
      "(AUTHORS_MIRROR, e.g. git clone --bare https://github.com/smonsays/hypernetwork-attention)" >&2
    exit 2
  fi
  # ml_collections 0.1.1 is an sdist only: a wheel built here; 1.1.0 for Python >= 3.12
  "${pip[@]}" wheel -q --no-deps ml_collections==0.1.1 -w .authors/wheels
  "${pip[@]}" download -q --no-deps --only-binary=:all: -d .authors/wheels \
    ml_collections==1.1.0 contextlib2==21.6.0 six==1.17.0
  local v
  for v in 3.11 3.12 3.13; do  # PyYAML, a fallback: compiled, one wheel per Python version
    "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version "$v" --implementation cp \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .authors/wheels PyYAML==6.0.3
  done
  grep -qx '/.authors/' .gitignore || echo '/.authors/' >> .gitignore
  ls -l .authors/wheels
  du -sh .authors
}

abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

site_dir() {
  echo "${AUTHORS_SITE:-.authors/site-$("$apy" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')}"
}

can_import() {  # module: importable by their Python with the site dir on its path?
  PYTHONPATH="$(abspath "$(site_dir)")" "$apy" -c "import $1" 2>/dev/null
}

install_site() {  # the wheels their Python lacks, into the site dir
  local site tag new want=() w
  site=$(site_dir)
  mkdir -p "$site"
  tag=$("$apy" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  new=$("$apy" -c 'import sys; print(int(sys.version_info >= (3, 12)))')
  if ! can_import ml_collections.config_flags; then
    if [ "$new" = 1 ]; then
      want+=("$wheels"/ml_collections-1.1.0-*.whl)
    else
      want+=("$wheels"/ml_collections-0.1.1-*.whl)
      can_import contextlib2 || want+=("$wheels"/contextlib2-*.whl)
    fi
  fi
  can_import six || want+=("$wheels"/six-*.whl)
  can_import yaml || want+=("$wheels"/[Pp][Yy][Yy][Aa][Mm][Ll]-*-"$tag"-*.whl)
  if [ "${#want[@]}" -eq 0 ]; then echo "their packages: all importable"; return 0; fi
  for w in "${want[@]}"; do
    [ -f "$w" ] || { echo "no wheel $w: run \`lab/gpu/gpu_sraven_verdict.sh prepare\` here and carry .authors" >&2; return 2; }
  done
  echo "installing into $site: ${want[*]##*/}"
  if "$apy" -m pip --version >/dev/null 2>&1; then
    "$apy" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "${want[@]}"
  else  # no pip: a wheel is a zip of what goes into site-packages
    for w in "${want[@]}"; do "$apy" -m zipfile -e "$w" "$site"; done
  fi
  if ! can_import ml_collections.config_flags || ! can_import yaml; then echo "their packages still missing (absl-py, jax, flax, optax, chex, einops must be there)" >&2; return 2; fi
}

case "${1:-}" in
  prepare) prepare; exit 0 ;;
  site) install_site; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [prepare | site]" >&2; exit 2 ;;
esac

device=${DEVICE:-cuda}
budget_s=$(awk "BEGIN { print int(${MINUTES:-9} * 60) }")
reserve_s=${RESERVE_S:-60}
archive=${ARCHIVE:-${OUT:-.}/gpu_sraven_verdict.tar.gz}
. "$here/archive.sh"
jax_cache=${JAX_CACHE-$verdict/jax_cache}
if [ "${#seeds[@]}" -gt 0 ] && [ ! -f "$code/run.py" ]; then
  echo "no authors' code at $code: run \`lab/gpu/gpu_sraven_verdict.sh prepare\` here and carry .authors" >&2
  exit 2
fi
start=$(date +%s)
end_s=$(( start + budget_s - reserve_s ))
# what this call writes or unpacks is newer than this file; the archive holds only that
marker=$(mktemp)
sleep 1
if [ -n "${RESUME_FROM:-}" ]; then unpack_archive "$RESUME_FROM"; fi
mkdir -p "$verdict"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
status=0  # 1 once a part failed: the call still goes on, packs what it has and then exits 1

# ---- 1. theirs ----------------------------------------------------------------------------------------
declare -A pid_of=() offset_of=() began_of=() ended_of=()
# a run of theirs is named by its seed S, or S:I for the swap of part 3 of #38 (split and batches of seed S, initial
# weights and dropout stream of seed I: the driver's --init_seed)
# a V/ prefix names their model of our variant V (default hyla)
variant_of() { case $1 in */*) echo "${1%%/*}" ;; *) echo hyla ;; esac; }
mixer_of() {
  case $(variant_of "$1") in
    hyla) echo linear_hypatt ;; softmax) echo softmax_attention ;; linear) echo linear_attention ;;
    *) echo "AUTHORS_SEEDS: $1: unknown variant (allowed: hyla, softmax, linear)" >&2; return 2 ;;
  esac
}
authors_dir() {
  local v s=${1#*/}
  v=$(variant_of "$1")
  case $s in *:*) echo "$logs/sraven-$v-seed${s%%:*}-init${s#*:}" ;; *) echo "$logs/sraven-$v-seed$s" ;; esac
}
init_flag() { local s=${1#*/}; case $s in *:*) echo "--init_seed=${s#*:}" ;; esac; }

launch_authors() {
  local seed dir envs extra swap mixer
  # their runs see their site dir, not our src/ (both hold a package `hyla`); log_dir is absolute, since the
  # driver imports their run.py from inside their checkout
  envs=(PYTHONPATH="$(abspath "$(site_dir)")" AUTHORS_CODE="$(abspath "$code")" JAX_PLATFORMS="$device"
    JAX_THREEFRY_PARTITIONABLE=false XLA_PYTHON_CLIENT_PREALLOCATE=false
    # etils.epath (a newer JAX reads its compilation cache through it) asks importlib whether tensorflow is
    # there, which the inert tensorflow module of the driver makes fail: no cache. EPATH_USE_TF=false skips that.
    EPATH_USE_TF=false)
  # on a CPU (the test), as authors_side_by_side.sh: XLA's own dot instead of oneDNN's slow reference kernel
  [ "$device" = cpu ] && envs+=(XLA_FLAGS="--xla_disable_hlo_passes=onednn-matmul-rewriter ${XLA_FLAGS:-}")
  [ -n "$jax_cache" ] && envs+=(JAX_COMPILATION_CACHE_DIR="$(abspath "$jax_cache")")
  read -r -a extra <<< "${AUTHORS_EXTRA:-}"
  for seed in "${seeds[@]}"; do
    dir=$(authors_dir "$seed")
    mixer=$(mixer_of "$seed")
    if [ -f "$dir/done" ]; then echo "theirs seed $seed: finished before"; continue; fi
    mkdir -p "$dir"
    touch "$dir/stdout.log"
    offset_of[$seed]=$(stat -c %s "$dir/stdout.log")
    echo "== $stamp: this call ($device)" >> "$dir/stdout.log"
    # JAX's float32 matmuls are TF32 on recent GPUs unless this says otherwise (their code sets no precision)
    if [ -n "${JAX_DEFAULT_MATMUL_PRECISION:-}" ]; then
      echo "== JAX_DEFAULT_MATMUL_PRECISION=$JAX_DEFAULT_MATMUL_PRECISION" >> "$dir/stdout.log"
    fi
    began_of[$seed]=$(date +%s)
    read -r -a swap <<< "$(init_flag "$seed")"
    # SIGTERM ignored until the driver's handler replaces that (its first lines): a stop sent earlier is lost,
    # and the stop below is sent again every few seconds
    (trap '' TERM; exec env "${envs[@]}" "$apy" "$here/../authors/authors_sraven_resumable.py" \
      "--config=configs/raven.py:raven_3x3_4features;$mixer" \
      --config.seed="$(s=${seed#*/}; echo "${s%%:*}")" "${swap[@]}" --config.data.num_test="${EVAL_PROBLEMS:-12800}" \
      --config.data.num_ood="${EVAL_PROBLEMS:-12800}" --config.log_dir="$(abspath "$dir")" \
      --eval_every="${EVAL_EVERY:-2500}" --log_every="${LOG_EVERY:-250}" --logger=standard \
      --save_every_minutes="${SAVE_EVERY_MINUTES:-2}" "${extra[@]}" >> "$dir/stdout.log" 2>&1) &
    pid_of[$seed]=$!
  done
}

running=()
check_running() {  # running: the seeds whose process still runs (ended_of: when the others ended)
  local seed
  running=()
  for seed in "${!pid_of[@]}"; do
    if [ -z "${ended_of[$seed]:-}" ]; then
      if kill -0 "${pid_of[$seed]}" 2>/dev/null; then running+=("$seed"); else ended_of[$seed]=$(date +%s); fi
    fi
  done
}

run_authors() {
  local seed stop_at rc grace dir
  stop_at=$end_s
  if [ -n "${AUTHORS_MINUTES:-}" ]; then
    stop_at=$(awk "BEGIN { s = $start + int($AUTHORS_MINUTES * 60); print (s < $end_s) ? s : $end_s }")
  fi
  echo "== theirs: seeds ${seeds[*]}, for $(( stop_at > $(date +%s) ? stop_at - $(date +%s) : 0 )) s unless finished"
  launch_authors
  check_running
  while [ "${#running[@]}" -gt 0 ] && [ "$(date +%s)" -lt "$stop_at" ]; do sleep 2; check_running; done
  if [ "${#running[@]}" -gt 0 ]; then
    echo "theirs: SIGTERM to seeds ${running[*]} (each saves after its step in progress, its first if none yet)"
    grace=$(( $(date +%s) + ${AUTHORS_GRACE_S:-120} ))
    while [ "${#running[@]}" -gt 0 ] && [ "$(date +%s)" -lt "$grace" ]; do
      for seed in "${running[@]}"; do kill -TERM "${pid_of[$seed]}" 2>/dev/null || true; done
      for _ in 1 2 3 4 5; do sleep 1; check_running; [ "${#running[@]}" -gt 0 ] || break; done
    done
    for seed in "${running[@]}"; do
      echo "theirs seed $seed: no exit ${AUTHORS_GRACE_S:-120} s after SIGTERM: killed (its last periodic save stays)"
      kill -KILL "${pid_of[$seed]}" 2>/dev/null || true
    done
    check_running
  fi
  for seed in "${!pid_of[@]}"; do
    rc=0; wait "${pid_of[$seed]}" || rc=$?
    dir=$(authors_dir "$seed")
    if [ "$rc" != 0 ]; then
      status=1
      echo "theirs seed $seed failed (exit $rc); the end of $dir/stdout.log:"
      tail -n 25 "$dir/stdout.log" | sed 's/^/    /'
    elif [ -f "$dir/state.pkl" ]; then
      touch "$dir/done"  # the driver writes state.pkl at the end of the schedule only
    fi
  done
}

report_authors() {  # their progress and speed this call, from stdout.log (batch indices) and event.log
  local seed args=()
  for seed in "${!pid_of[@]}"; do
    args+=("$seed" "$(authors_dir "$seed")" "${offset_of[$seed]}" $(( ${ended_of[$seed]:-$(date +%s)} - ${began_of[$seed]} )))
  done
  [ "${#args[@]}" -gt 0 ] || return 0
  "$py" - "${args[@]}" <<'PY'
import re
import statistics
import sys

args = sys.argv[1:]
for i in range(0, len(args), 4):
    seed, run_dir, offset, wall = args[i], args[i + 1], int(args[i + 2]), int(args[i + 3])
    with open(f"{run_dir}/stdout.log", errors="replace") as f:
        f.seek(offset)
        out = f.read()
    try:
        with open(f"{run_dir}/event.log", errors="replace") as f:
            events = f.read()
    except FileNotFoundError:
        events = ""
    batch = re.search(r"^batch_size: (\d+)$", events, re.M)
    train = re.search(r"^  num_train: (\d+)$", events, re.M)
    total = int(train.group(1)) // int(batch.group(1)) if batch and train else None
    resumed = re.search(r"Resuming at batch index (\d+)", out)
    first = int(resumed.group(1)) if resumed else 0
    saved = re.findall(r"saved \S+ at batch index (\d+)", out)
    finished = "Saving experiment state to disk" in out
    last = total if finished else (int(saved[-1]) if saved else None)
    # the train lines this call logged: train_steps_per_sec over each log_every steps (evaluations and, in the
    # first after a start, the compilation included)
    lines = re.findall(r"step: (\d+) \ttrain_.*train_steps_per_sec: ([0-9.]+)", events)
    now = [(int(s), float(r)) for s, r in lines if int(s) > first]
    speed = "no train line logged this call"
    if now:
        rates = [r for _, r in now]
        speed = f"train_steps_per_sec this call: median {statistics.median(rates):.1f}, last {rates[-1]:.1f} ({len(rates)} lines)"
    if last is None:
        print(f"theirs seed {seed}: no state saved this call ({wall} s); {speed}")
        continue
    done = last - first
    left = "finished" if finished or last == total else (f"{total - last:,} steps left" if total else "")
    rate = f"{done / wall:.1f}/s over the call's {wall} s" if wall > 0 else ""
    print(f"theirs seed {seed}: batch index {first:,} -> {last:,} of {total or '?':,} (+{done:,}, {rate}, start and evaluations included); {left}")
    print(f"  {speed}")
PY
}

if [ "${#seeds[@]}" -gt 0 ]; then
  # a setup that fails costs seconds, and ours still gets the call
  if install_site && PYTHONPATH="$(abspath "$(site_dir)")" JAX_PLATFORMS="$device" "$apy" -c \
    'import importlib.metadata, sys, jax, flax, optax; print("theirs: Python", sys.version.split()[0], "jax", jax.__version__, "flax", flax.__version__, "optax", optax.__version__, "ml_collections", importlib.metadata.version("ml_collections"), jax.devices())'; then
    run_authors
    report_authors
  else
    status=1
    echo "THEIRS SKIPPED: their packages, or JAX on $device, failed (above)"
  fi
fi

# ---- 2. ours -----------------------------------------------------------------------------------------
ours_s=$(( end_s - $(date +%s) ))
[ "$ours_s" -gt 0 ] || ours_s=0
ours_archive=$(mktemp -u).tar.gz
ours_log="$verdict/ours-$stamp.log"
export PYTHONPATH=${PYTHONPATH:-src}
rc=0
if [ "${STAGES:-}" = none ]; then
  echo "== ours: none (STAGES=none)"
  : > "$ours_log"
else
echo "== ours: lab/gpu/gpu_paper.sh, STAGES=${STAGES:-sraven-hyla}, $ours_s s"
# ours is read whole into this call's archive (PART_MIB: never in parts)
MINUTES=$(awk "BEGIN { print $ours_s / 60 }") STAGES=${STAGES:-sraven-hyla} ARCHIVE="$ours_archive" \
  LATENTS=${LATENTS:-0} PAPER_OUT=${PAPER_OUT:-$verdict/paper} DEVICE="$device" PYTHON="$py" RESUME_FROM='' \
  PART_MIB=1048576 bash "$here/gpu_paper.sh" > "$ours_log" 2>&1 || rc=$?
fi
grep -v '^  left: ' "$ours_log" || true
sraven_name=$("$py" -c "import sys; from hyla.train.sweeps import load_sweep; print(load_sweep(sys.argv[1]).name)" \
  "${SRAVEN:-table_a1_sraven}" 2>/dev/null || echo table_a1_sraven)
left_hyla=$(grep -c "^  left: .*/$sraven_name/hyla-" "$ours_log" || true)
[ "$rc" = 0 ] || { status=1; echo "ours failed (exit $rc): $ours_log"; left_hyla="? (ours failed)"; }

# ---- the archive ---------------------------------------------------------------------------------------
list=$(mktemp)
{
  [ -f "$ours_archive" ] && tar -tzf "$ours_archive" | grep -v '/$'
  for seed in "${seeds[@]}"; do
    dir=$(authors_dir "$seed")
    [ -d "$dir" ] && find "$dir" -type f ! -name state.pkl ! -name 'resume.pkl.*'
  done
  [ -n "$jax_cache" ] && [ -d "$jax_cache" ] && find "$jax_cache" -type f
  find "$verdict" -maxdepth 1 -type f -name '*.log'
} | sort -u | while read -r f; do if [ -f "$f" ] && [ "$f" -nt "$marker" ]; then echo "$f"; fi; done > "$list" || true
pack_archive "$archive" "$list"
echo "  of which their resume.pkl: $(grep '/resume.pkl$' "$list" | xargs -r stat -c %s | awk '{ s += $1 } END { print s + 0 }') bytes"
rm -f "$list" "$marker" "$ours_archive"

# ---- what is left --------------------------------------------------------------------------------------
echo "== left after this call ($(( $(date +%s) - start )) s):"
for seed in "${seeds[@]}"; do
  dir=$(authors_dir "$seed")
  if [ -f "$dir/done" ]; then echo "  theirs seed $seed: finished"; else echo "  theirs seed $seed: not finished"; fi
done
echo "  ours, SRAVEN HYLA: $left_hyla runs left"
exit "$status"
