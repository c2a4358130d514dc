#!/usr/bin/env bash
# Language-model comparison on one GPU (~20 GPU-minutes): softmax vs linear vs HYLA, lm-small, equal tokens.
# Run from the repository root on the GPU machine; the corpus is the offline one unless you override
# data.corpus (e.g. data.corpus=hf:wikitext data.dataset_config=wikitext-103-raw-v1 where the hub is reachable).
set -euo pipefail
out=${OUT:-runs/lm_gpu}
export PYTHONPATH=${PYTHONPATH:-src}
steps=${STEPS:-6000}
for v in softmax linear hyla; do
  python -m hyla train lm_small model.attention=$v name=lm_small_$v train.steps=$steps --device cuda \
    --out "$out/$v" --quiet
done
python - "$out" <<'PY'
import json, sys, pathlib
root = pathlib.Path(sys.argv[1])
for run in sorted(p for p in root.iterdir() if (p / "metrics.jsonl").is_file()):
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r["split"] == "val"][-1]
    import math
    print(f"{run.name:10s} step {val['step']:6d}  val loss {val['loss']:.4f}  val ppl exp(mean loss) {math.exp(val['loss']):.2f}")
PY
