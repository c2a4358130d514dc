#!/usr/bin/env bash
# Side by side on the fuzzy-logic task (Table A1 setting, short schedule): the authors' public JAX code
# (smonsays/hypernetwork-attention) and ours, same data sizes and optimiser, same number of steps.
# Curves are collected by lab/authors/side_by_side.py into lab/tables/side_by_side/curves.json.
#
# Their code is never part of this repository: point AUTHORS_CODE at a checkout of it and AUTHORS_VENV at a
# Python 3.11 venv made with `lab/authors/authors_side_by_side.sh venv` (CPU jax; the pins below).
# Their run.py imports tensorflow (only to hide GPUs), wandb (a logger we do not use) and the wikitext
# stack (datasets, sentencepiece, tensorflow_datasets, tensorflow_text) at module level; none of them is
# used by a fuzzy-logic run with --logger=standard, so a launcher written by this script (outside their
# code) puts inert stubs for those modules in sys.modules and then runs their run.py unchanged.
#
# Usage:
#   AUTHORS_CODE=/work/authors/code AUTHORS_VENV=/work/authors/venv lab/authors/authors_side_by_side.sh venv
#   AUTHORS_CODE=... AUTHORS_VENV=... lab/authors/authors_side_by_side.sh all        # (a)+(b)+(c)+(d)
#   ... lab/authors/authors_side_by_side.sh authors hyla 0       # one run of theirs: variant, seed
#   ... lab/authors/authors_side_by_side.sh ours authors hyla 0  # one run of ours: setup, variant, seed
#   ... lab/authors/authors_side_by_side.sh ours-stacked library_defaults hyla 0,1,2  # seeds as one stack
#   STEPS=10000 EVAL_EVERY=2500 ... lab/authors/authors_side_by_side.sh authors-sraven hyla 0
#       # SRAVEN: their configs/raven.py at its full schedule (20M problems, 156,250 steps), stopped once the
#       # evaluation after STEPS updates is logged; compare with our paper run's metrics.jsonl (same seed)
#   STEPS=10000 EVAL_EVERY=2500 ... lab/authors/authors_side_by_side.sh authors-sraven-resumable hyla 0
#       # the same run through lab/authors/authors_sraven_resumable.py (their Experiment.run loop, our driver):
#       # saves resume.pkl every 5 minutes and on SIGTERM/SIGINT, and a later call (same or larger STEPS)
#       # resumes from it, appending to event.log; stops where authors-sraven does
#   then: .venv/bin/python lab/authors/side_by_side.py
#
# Environment: STEPS (default 1100), EVAL_EVERY (500), AUTHORS_LOGS (runs/side_by_side/authors),
# OURS_RUNS (runs/side_by_side/hyla), EVAL_PROBLEMS (SRAVEN eval split size, 12800).
# Checkout used: smonsays/hypernetwork-attention af9805f.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AUTHORS_CODE="${AUTHORS_CODE:-/work/authors/code}"
AUTHORS_VENV="${AUTHORS_VENV:-/work/authors/venv}"
STEPS="${STEPS:-1100}"
EVAL_EVERY="${EVAL_EVERY:-500}"
AUTHORS_LOGS="${AUTHORS_LOGS:-$REPO_ROOT/runs/side_by_side/authors}"
OURS_RUNS="${OURS_RUNS:-$REPO_ROOT/runs/side_by_side/hyla}"
HYLA="${HYLA:-$REPO_ROOT/.venv/bin/hyla}"
# One thread per process (THREADS=1, the default here): these runs were made on 2 shared cores with other jobs
# running, where multi-threaded BLAS/Eigen pools oversubscribe the cores and slow every process down.
THREADS="${THREADS:-1}"
export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
# (The fuzzy-logic runs in lab/tables/side_by_side were made with ` intra_op_parallelism_threads=1` after this
# flag: not an XLA flag, and XLA stops reading XLA_FLAGS at a bare word, so it never applied.)
export XLA_FLAGS="${XLA_FLAGS:---xla_cpu_multi_thread_eigen=$([[ $THREADS == 1 ]] && echo false || echo true)}"

# pip freeze of the venv these results were made with (Python 3.11.x, CPU only)
AUTHORS_PINS=(
  "jax[cpu]==0.4.30" jaxlib==0.4.30 flax==0.8.5 optax==0.2.3 chex==0.1.86 ml_collections==0.1.1
  absl-py==2.1.0 einops==0.8.0 numpy==1.26.4 scipy==1.17.1 orbax-checkpoint==0.6.4 tensorstore==0.1.86
  ml_dtypes==0.5.4 msgpack==1.2.4 etils==1.15.0 opt_einsum==3.4.0 PyYAML==6.0.3 protobuf==7.36.2
  contextlib2==21.6.0 typing_extensions==4.16.0 rich==15.0.0 toolz==1.2.0
)

make_venv() {
  python3.11 -m venv "$AUTHORS_VENV"
  "$AUTHORS_VENV/bin/pip" install --upgrade pip
  "$AUTHORS_VENV/bin/pip" install "${AUTHORS_PINS[@]}"
}

launcher() {
  # Written next to the venv, never into their checkout or ours.
  local path="$AUTHORS_VENV/hyla_side_by_side_launch.py"
  cat >"$path" <<'PY'
"""Run the authors' run.py unchanged, with inert stand-ins for modules a fuzzy-logic run never uses."""
import os
import runpy
import sys
import types


class _Inert:
    def __getattr__(self, name):
        return _Inert()

    def __call__(self, *args, **kwargs):
        return _Inert()


def _stub(name):
    module = types.ModuleType(name)
    module.__getattr__ = lambda attr: _Inert()
    sys.modules[name] = module


for name in ("tensorflow", "tensorflow_datasets", "tensorflow_text", "datasets", "sentencepiece", "wandb"):
    try:
        __import__(name)
    except ImportError:
        _stub(name)

code = os.environ["AUTHORS_CODE"]
os.chdir(code)
sys.path.insert(0, code)
sys.argv = [os.path.join(code, "run.py")] + sys.argv[1:]
runpy.run_path(os.path.join(code, "run.py"), run_name="__main__")
PY
  echo "$path"
}

authors_model() {  # our variant name -> their configs/logic.py model name
  case "$1" in
    hyla) echo linear_hypatt ;;
    softmax) echo transformer ;;
    linear) echo linear_attention ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

run_authors() {  # variant seed
  local variant="$1" seed="$2" dir
  dir="$AUTHORS_LOGS/$variant-seed$seed"
  if [[ -f "$dir/done" ]]; then echo "skip $dir"; return; fi
  rm -rf "$dir"; mkdir -p "$dir"
  local py
  py="$(launcher)"
  # Table A1 (sweeps/logic_ablation.yaml): seq_len 32, frac_test 0.7, lr 1e-3, wd 0.1; schedule length =
  # num_train // batch_size; eval sets num_test = num_ood = 16000 (their default); evaluation at loop
  # steps 0, EVAL_EVERY, ... (logged as step+1) and after the last step; log_every must divide eval_every.
  AUTHORS_CODE="$AUTHORS_CODE" JAX_PLATFORMS=cpu "$AUTHORS_VENV/bin/python" "$py" \
    "--config=configs/logic.py:logic_4var_2term;$(authors_model "$variant")" \
    --config.data.seq_len=32 --config.data.frac_test=0.7 --config.lr=0.001 --config.weight_decay=0.1 \
    --config.seed="$seed" --config.data.num_train=$((STEPS * 128)) \
    --config.log_dir="$dir" --eval_every="$EVAL_EVERY" --log_every=100 --logger=standard \
    >"$dir/stdout.log" 2>&1
  rm -f "$dir/state.pkl"  # the trained parameters; not needed for the curves
  touch "$dir/done"
}

run_authors_sraven() {  # variant seed: the first STEPS updates of their SRAVEN paper run, then stopped
  local variant="$1" seed="$2" dir pid
  local EVAL_PROBLEMS="${EVAL_PROBLEMS:-12800}"
  dir="$AUTHORS_LOGS/sraven-$variant-seed$seed"
  if [[ -f "$dir/done" ]]; then echo "skip $dir"; return; fi
  rm -rf "$dir"; mkdir -p "$dir"
  local py
  py="$(launcher)"
  # configs/raven.py unchanged (lr 1e-3, wd 0.1, warmup 1000, batch 128, 20M problems = 156,250 steps)
  # but the seed, the logging and the size of the eval splits (theirs 51,200; EVAL_PROBLEMS, default 12,800).
  # XLA's oneDNN matmul rewrite is switched off: on an AVX2 machine it sends their attention-score matmul
  # (with the position bias added) to oneDNN's reference kernel, 0.5 s a call; XLA's own dot is used
  # instead. The flag goes first (XLA stops reading XLA_FLAGS at a bare word; see above). The run's
  # evaluation after STEPS updates is logged as step STEPS + 1 (see the fuzzy-logic runs); its ood line
  # comes last.
  XLA_FLAGS="--xla_disable_hlo_passes=onednn-matmul-rewriter $XLA_FLAGS" \
    AUTHORS_CODE="$AUTHORS_CODE" JAX_PLATFORMS=cpu "$AUTHORS_VENV/bin/python" "$py" \
    "--config=configs/raven.py:raven_3x3_4features;$(authors_model "$variant")" \
    --config.seed="$seed" --config.data.num_test="$EVAL_PROBLEMS" --config.data.num_ood="$EVAL_PROBLEMS" \
    --config.log_dir="$dir" --eval_every="$EVAL_EVERY" --log_every=250 \
    --logger=standard >"$dir/stdout.log" 2>&1 &
  pid=$!
  until grep -q "step: $((STEPS + 1)) .*ood_acc" "$dir/event.log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then echo "their run ended before step $STEPS: $dir/stdout.log" >&2; exit 1; fi
    sleep 30
  done
  kill "$pid"; wait "$pid" || true
  touch "$dir/done"
}

run_authors_sraven_resumable() {  # variant seed: as run_authors_sraven, resumable (resume.pkl in the run dir)
  local variant="$1" seed="$2" dir model pid rc
  local EVAL_PROBLEMS="${EVAL_PROBLEMS:-12800}"
  dir="$AUTHORS_LOGS/sraven-$variant-seed$seed"
  model="$(authors_model "$variant")"
  if [[ ! -f "$dir/resume.pkl" ]]; then
    # a finished authors-sraven run (no state to resume from) is kept
    if [[ -f "$dir/done" ]]; then echo "skip $dir (an authors-sraven run)"; return; fi
    rm -rf "$dir"
  fi
  mkdir -p "$dir"
  # Their config and flags as in run_authors_sraven; --stop_after=STEPS stops after the evaluation logged as
  # step STEPS + 1 when STEPS is a multiple of EVAL_EVERY, where that function stops their run.py. The python
  # runs in the background with SIGTERM/SIGINT forwarded, so that a signal to this script lets it save first.
  XLA_FLAGS="--xla_disable_hlo_passes=onednn-matmul-rewriter $XLA_FLAGS" \
    AUTHORS_CODE="$AUTHORS_CODE" JAX_PLATFORMS=cpu "$AUTHORS_VENV/bin/python" \
    "$REPO_ROOT/lab/authors/authors_sraven_resumable.py" \
    "--config=configs/raven.py:raven_3x3_4features;$model" \
    --config.seed="$seed" --config.data.num_test="$EVAL_PROBLEMS" --config.data.num_ood="$EVAL_PROBLEMS" \
    --config.log_dir="$dir" --eval_every="$EVAL_EVERY" --log_every=250 --logger=standard \
    --stop_after="$STEPS" >>"$dir/stdout.log" 2>&1 &
  pid=$!
  trap 'kill -TERM "$pid" 2>/dev/null' TERM INT
  wait "$pid" || true  # returns early when the trap has run
  while kill -0 "$pid" 2>/dev/null; do wait "$pid" || true; done
  rc=0; wait "$pid" || rc=$?  # bash keeps the status of a finished child
  trap - TERM INT
  if [[ $rc != 0 ]]; then echo "their run failed ($rc): $dir/stdout.log" >&2; exit 1; fi
}

# Ours: the authors' setup is src/hyla/configs/fuzzy_logic.yaml itself; the library defaults undo each of its
# authors'-code options; a flip undoes one of them.
LIBRARY_DEFAULTS=(data.split_style=cover data.num_unseen_terms=0 data.split_seed=0
  model.relative_position_bidirectional=null model.attention_dropout=0 model.init=torch
  model.gelu_approximate=none model.norm_eps=1e-5 train.weight_decay_mask=ndim train.cosine_end=steps)

setup_overrides() {
  case "$1" in
    authors) ;;
    library_defaults) echo "${LIBRARY_DEFAULTS[@]}" ;;
    split_style) echo data.split_style=cover data.num_unseen_terms=0 ;;
    split_seed) echo data.split_seed=0 ;;
    relative_position_bidirectional) echo model.relative_position_bidirectional=null ;;
    attention_dropout) echo model.attention_dropout=0 ;;
    init) echo model.init=torch ;;
    relative_position_span) echo model.relative_position_buckets=null model.relative_position_max_distance=null ;;
    *) echo "unknown setup $1" >&2; exit 2 ;;
  esac
}

run_ours() {  # setup variant seed
  local setup="$1" variant="$2" seed="$3" dir
  dir="$OURS_RUNS/$setup/$variant-seed$seed"
  if [[ -f "$dir/metrics.jsonl" ]] && grep -q "\"step\": $STEPS" "$dir/metrics.jsonl"; then
    echo "skip $dir"; return
  fi
  rm -rf "$dir"
  # shellcheck disable=SC2046
  "$HYLA" train fuzzy_logic "model.attention=$variant" "seed=$seed" "train.steps=$STEPS" \
    "train.eval_every=$EVAL_EVERY" "train.checkpoint_every=$STEPS" $(setup_overrides "$setup") \
    --out "$dir" --quiet
}

run_ours_stacked() {  # setup variant seeds (e.g. 0,1,2): one stacked model, OUT/seedN per seed; only for
  # setups without attention dropout (hyla refuses to stack those), i.e. library_defaults and attention_dropout
  local setup="$1" variant="$2" seeds="$3" dir
  dir="$OURS_RUNS/$setup/$variant-stacked"
  if [[ -f "$dir/done" ]]; then echo "skip $dir"; return; fi
  rm -rf "$dir"
  # shellcheck disable=SC2046
  "$HYLA" train fuzzy_logic "model.attention=$variant" "train.steps=$STEPS" \
    "train.eval_every=$EVAL_EVERY" "train.checkpoint_every=$STEPS" $(setup_overrides "$setup") \
    --seeds "$seeds" --out "$dir" --quiet
  touch "$dir/done"
}

case "${1:-all}" in
  venv) make_venv ;;
  authors) run_authors "$2" "$3" ;;
  authors-sraven) run_authors_sraven "$2" "$3" ;;
  authors-sraven-resumable) run_authors_sraven_resumable "$2" "$3" ;;
  ours) run_ours "$2" "$3" "$4" ;;
  ours-stacked) run_ours_stacked "$2" "$3" "$4" ;;
  all)
    for s in 0 1 2; do run_authors hyla "$s"; run_ours authors hyla "$s"; done           # (a)
    run_ours_stacked library_defaults hyla 0,1,2                                       # (b)
    for s in 0 1 2; do run_authors softmax "$s"; run_ours authors softmax "$s"; done     # (c)
    for flip in split_style split_seed relative_position_bidirectional attention_dropout init relative_position_span; do  # (d)
      if [[ $flip == attention_dropout ]]; then run_ours_stacked "$flip" hyla 0,1,2; continue; fi
      for s in 0 1 2; do run_ours "$flip" hyla "$s"; done
    done
    ;;
  *) echo "usage: $0 venv | all | authors VARIANT SEED | authors-sraven VARIANT SEED | authors-sraven-resumable VARIANT SEED | ours SETUP VARIANT SEED | ours-stacked SETUP VARIANT SEEDS" >&2
     exit 2 ;;
esac
