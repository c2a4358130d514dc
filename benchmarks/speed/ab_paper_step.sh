#!/usr/bin/env bash
# A/B of the paper configs' own training step on one thread (`hyla bench train`, one lone run: sampling,
# forward, backward and AdamW as a paper run trains them, tanh GELU and attention dropout included; not
# `hyla bench step`, whose model keeps torch's defaults) between another commit and the working tree, the
# working tree once per value of SETTING (an environment variable, e.g. HYLA_FAST_GELU=off,auto), sides
# alternating over ROUNDS rounds. Each side runs with what its own `hyla` command preloads (hyla.cpu).
# Stop other work on the machine first (or pause it: kill -STOP / -CONT): two cores shared with anything
# else measure the other thing.
#
# Usage: benchmarks/speed/ab_paper_step.sh OLD_REF OUT [VAR=V1,V2]
# Environment: ROUNDS (default 3), TASKS (default "sraven fuzzy_logic"), VARIANTS (default softmax,hyla)
# Writes OUT/<side>/<task>_r<round>.json and prints OUT/summary.md (median ms a step per side).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OLD_REF="$1"
OUT="$(realpath -m "$2")"
SETTING="${3:-}"
ROUNDS="${ROUNDS:-3}"
TASKS="${TASKS:-sraven fuzzy_logic}"
VARIANTS="${VARIANTS:-softmax,hyla}"
PY="$REPO_ROOT/.venv/bin/python"

sides=(old)
if [ -n "$SETTING" ]; then
    var="${SETTING%%=*}"
    for value in $(echo "${SETTING#*=}" | tr ',' ' '); do sides+=("$var=$value"); done
else
    sides+=(new)
fi

tmp="$(mktemp -d)"
git -C "$REPO_ROOT" worktree add --detach "$tmp/old" "$OLD_REF" >/dev/null 2>&1
trap 'git -C "$REPO_ROOT" worktree remove --force "$tmp/old"; rm -rf "$tmp"' EXIT

for round in $(seq 1 "$ROUNDS"); do
    for side in "${sides[@]}"; do
        src="$REPO_ROOT"
        side_env=()
        [ "$side" = old ] && src="$tmp/old"
        [[ "$side" == *=* ]] && side_env=("$side")
        preload="$(cd "$src" && PYTHONPATH="$src/src" "$PY" -m hyla.cpu --auto 2>/dev/null)" || preload=""
        mkdir -p "$OUT/$side"
        for task in $TASKS; do
            (cd "$src" && env $preload "${side_env[@]}" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH="$src/src" \
                "$PY" -m hyla bench train --task "$task" --variants "$VARIANTS" --seeds 1 --steps 10 --repeats 3 \
                --warmup 3 --json "$OUT/$side/${task}_r$round.json" >/dev/null)
        done
        echo "round $round: $side done"
    done
done

"$PY" - "$OUT" "$OLD_REF" "${sides[@]}" <<'EOF'
import json, statistics, sys
from pathlib import Path
out, old_ref, sides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
rows = {}
for side in sides:
    for f in sorted((out / side).glob("*_r*.json")):
        d = json.loads(f.read_text())
        for variant, r in d["variants"].items():
            rows.setdefault((d["task"], variant), {}).setdefault(side, []).append(r["lone_ms_per_step"])
head = "| task | variant | " + " | ".join(f"{s} (ms)" for s in sides) + " | " + " | ".join(f"speed-up, {s}" for s in sides[1:]) + " |"
lines = [f"One thread, lone run, median of the rounds' medians; old = {old_ref}.", "", head, "|" + "---|" * (2 + 2 * len(sides) - 1)]
for (task, variant), per in sorted(rows.items()):
    med = {s: statistics.median(per[s]) for s in sides if s in per}
    rounds = {s: " / ".join(f"{v:.1f}" for v in per[s]) for s in med}
    ratio = [f"{med['old'] / med[s]:.2f}x" if s in med and "old" in med else "-" for s in sides[1:]]
    cells = [f"{med[s]:.1f} ({rounds[s]})" if s in med else "-" for s in sides]
    lines.append(f"| {task} | {variant} | " + " | ".join(cells) + " | " + " | ".join(ratio) + " |")
text = "\n".join(lines) + "\n"
(out / "summary.md").write_text(text)
print(text)
EOF
