#!/usr/bin/env bash
# A/B of the CPU speed tables (training throughput, lone and stacked; step time per attention variant)
# between another commit and the working tree, on one machine in one sitting, sides alternating over
# ROUNDS rounds (a shared machine drifts by 10% between commands). Summary: benchmarks/speed/ab_speed.py.
#
# Usage: benchmarks/speed/ab_speed.sh [OLD_REF] [OUT]   (defaults: 8252169, the commit before the training
#        restructure into one shell and two engines; lab/tables/restructure_speed)
# Environment: ROUNDS (default 2); SUITE, one of
#   all              the tables above, on the machine's threads (default);
#   one-thread-step  the model step of the SRAVEN and fuzzy-logic paper models, softmax and HYLA, attention
#                    dropout 0.1 as the paper configs train, on one thread: what a background paper run does,
#                    alone and two at once as the paper runs train here; then each side's profile of those steps
#                    (benchmarks/speed/profile_step.py);
#   paper-step       the paper configs' own training step (`hyla bench train`, one lone run, one thread:
#                    sampling, forward, backward and AdamW as a paper run trains them, tanh GELU included; not
#                    `hyla bench step`, whose model keeps torch's defaults). With SETTING=VAR=V1,V2 (an
#                    environment variable, e.g. HYLA_FAST_GELU=off,auto) the working tree runs once per value,
#                    each a side of its own.
# Each side runs with what its own `hyla` command preloads (hyla.cpu; nothing before that existed). Stop other
# work on the machine first (or pause it: kill -STOP / -CONT): the timings are medians of blocks, but two cores
# shared with anything else measure the other thing.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OLD_REF="${1:-8252169}"
OUT="$(realpath -m "${2:-$REPO_ROOT/results/restructure_speed}")"
ROUNDS="${ROUNDS:-2}"
SUITE="${SUITE:-all}"
SETTING="${SETTING:-}"
case "$SUITE" in
    all | one-thread-step | paper-step) ;;
    *) echo "SUITE must be all, one-thread-step or paper-step, got $SUITE" >&2; exit 2 ;;
esac
if [ -n "$SETTING" ] && { [ "$SUITE" != paper-step ] || [[ "$SETTING" != ?*=?* ]]; }; then
    echo "SETTING must be VAR=V1,V2,... with SUITE=paper-step, got SETTING=$SETTING SUITE=$SUITE" >&2
    exit 2
fi
PY="$REPO_ROOT/.venv/bin/python"

sides=(old)
if [ -n "$SETTING" ]; then
    for value in $(echo "${SETTING#*=}" | tr ',' ' '); do sides+=("${SETTING%%=*}=$value"); done
else
    sides+=(new)
fi

tmp="$(mktemp -d)"
git -C "$REPO_ROOT" worktree add --detach "$tmp/old" "$OLD_REF" >/dev/null 2>&1
trap 'git -C "$REPO_ROOT" worktree remove --force "$tmp/old"; rm -rf "$tmp"' EXIT

checkout() {  # side -> the checkout it runs from
    if [ "$1" = old ]; then echo "$tmp/old"; else echo "$REPO_ROOT"; fi
}

bench() {  # side, then the arguments of `hyla bench`; a side named VAR=VALUE sets that variable
    # (the `hyla` command preloads what it wants itself, under that side's settings: HYLA_FAST_BLAS=off too)
    local side="$1" src
    shift
    src="$(checkout "$side")"
    local side_env=()
    [[ "$side" == *=* ]] && side_env=("$side")
    (cd "$src" && env "${side_env[@]}" PYTHONPATH="$src/src" "$PY" -m hyla bench "$@" >/dev/null)
}

for round in $(seq 1 "$ROUNDS"); do
    for side in "${sides[@]}"; do
        dir="$OUT/$side"
        mkdir -p "$dir"
        case "$SUITE" in
        paper-step)
            for task in sraven fuzzy_logic; do
                OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 bench "$side" train --task "$task" --variants softmax,hyla \
                    --seeds 1 --steps 10 --repeats 3 --warmup 3 --json "$dir/paper_${task%_logic}_r$round.json"
            done
            ;;
        one-thread-step)
            for task in sraven fuzzy_logic; do
                OMP_NUM_THREADS=1 bench "$side" step --task "$task" --variants softmax,hyla --dropout 0.1 --steps 30 \
                    --json "$dir/step_${task%_logic}_r$round.json"
                # two at once, one thread each: how the paper runs train here, sharing one memory system
                for copy in a b; do
                    OMP_NUM_THREADS=1 bench "$side" step --task "$task" --variants softmax,hyla --dropout 0.1 \
                        --steps 30 --json "$dir/pair_${task%_logic}_r$round$copy.json" &
                done
                wait
            done
            ;;
        all)
            # the old side's stacks ran each run in its own thread by default; time its run-by-run stack too
            extra=()
            [ "$side" = old ] && extra=(--also-stack-forward loop)
            bench "$side" train --task fuzzy_logic --variants softmax,hyla --seeds 3 --steps 20 --repeats 5 \
                "${extra[@]}" --json "$dir/train_fuzzy_r$round.json"
            bench "$side" train --task sraven --variants softmax,hyla --seeds 3 --steps 10 --repeats 3 \
                "${extra[@]}" --json "$dir/train_sraven_r$round.json"
            bench "$side" step --task sraven --variants softmax,linear,hyla,hyla_plus --steps 30 \
                --json "$dir/step_sraven_r$round.json"
            bench "$side" step --task fuzzy_logic --variants softmax,linear,hyla --steps 30 \
                --json "$dir/step_fuzzy_r$round.json"
            ;;
        esac
        echo "round $round: $side done"
    done
done
if [ "$SUITE" = one-thread-step ]; then
    for side in old new; do
        src="$(checkout "$side")"
        # a plain script, not the `hyla` command: what that side's command would preload (MKL's vendor check
        # overridden on an AMD CPU since #47)
        preload="$(cd "$src" && PYTHONPATH="$src/src" "$PY" -m hyla.cpu --auto 2>/dev/null)" || preload=""
        for task in sraven fuzzy_logic; do
            for variant in softmax hyla; do
                env $preload OMP_NUM_THREADS=1 PYTHONPATH="$src/src" "$PY" "$REPO_ROOT/benchmarks/speed/profile_step.py" \
                    --task "$task" --variant "$variant" --json "$OUT/$side/profile_${task%_logic}_$variant.json" >/dev/null
            done
        done
    done
fi
"$PY" "$REPO_ROOT/benchmarks/speed/ab_speed.py" "$OUT" "$OLD_REF" "${sides[@]}" | tee "$OUT/summary.md"
