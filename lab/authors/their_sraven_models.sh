#!/usr/bin/env bash
# The authors' finished SRAVEN HYLA seeds (lab/tables/gpu_sraven_verdict, 156,250 updates on one H100) as run
# directories of ours, which `hyla analyze` reads:
#   bash lab/authors/their_sraven_models.sh OUT_DIR   ->   OUT_DIR/theirs-seed{0,1,2}/{config.yaml,model.safetensors}
# RUNS="seed0-init1 seed1-init0" takes the swaps instead (their states at commit a025a0a: about 63,500 updates).
# Their final states left the tree after commit a025a0a: each is read from git there, its params written by
# authors_sraven_resumable.py --dump_trained (their venv) and imported by authors_equivalence.py import-run (the
# paper config at their seed, with their held-out tasks: data.heldout_draw=authors).
# Environment: RUNS ["seed0 seed1 seed2"]  STATES_COMMIT [a025a0a]  AUTHORS_VENV [/work/authors/venv]
#   AUTHORS_CODE [/work/authors/code]  PYTHON [.venv/bin/python]
set -euo pipefail
out=${1:?usage: $0 OUT_DIR}
commit=${STATES_COMMIT:-a025a0a}
venv=${AUTHORS_VENV:-/work/authors/venv}
code=${AUTHORS_CODE:-/work/authors/code}
py=${PYTHON:-.venv/bin/python}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for run in ${RUNS:-seed0 seed1 seed2}; do
  seed=${run#seed}
  seed=${seed%%-*}  # the split's seed: seedS or seedS-initI
  state=$out/state-$run
  mkdir -p "$state"
  state=$(cd "$state" && pwd)  # the driver wants an absolute log_dir
  git -C "$here/../.." show "$commit:lab/tables/gpu_sraven_verdict/authors/sraven-hyla-$run/resume.pkl" > "$state/resume.pkl"
  AUTHORS_CODE=$code JAX_PLATFORMS=cpu "$venv/bin/python" "$here/authors_sraven_resumable.py" \
    "--config=configs/raven.py:raven_3x3_4features;linear_hypatt" --config.seed="$seed" \
    --config.log_dir="$state" --logger=standard --dump_trained="$state/params.npz"
  "$py" "$here/authors_equivalence.py" import-run --their-init "$state/params.npz" --seed "$seed" \
    --out "$out/theirs-$run"
done
