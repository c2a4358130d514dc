#!/usr/bin/env bash
# Language-model comparison on one GPU (~20 GPU-minutes): softmax vs linear vs HYLA, lm-small, equal tokens.
# Run from the repository root on the GPU machine; the corpus is the offline one unless you override
# data.corpus (e.g. data.corpus=hf:wikitext data.dataset_config=wikitext-103-raw-v1 where the hub is reachable).
set -euo pipefail
out=${OUT:-runs/lm_gpu}
export PYTHONPATH=${PYTHONPATH:-src}
steps=${STEPS:-6000}  # EXTRA: more KEY=VALUE overrides (e.g. train.eval_every=500)
# CORPUS: data.corpus. The standard library (default) gives 8.5M training tokens (lm_small's tokenizer,
# Python 3.11, read and tokenized in 21 s on the 2-core CPU machine), seen many times in a 20-minute run. A
# site-packages folder is larger: the CPU machine's .venv one gives 59M (139 s, once per run). A run's first
# line says it: `hyla train lm_small train.steps=1 data.corpus=FOLDER --out DIR`. On the GPU machine:
#   CORPUS=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') STEPS=... bash lab/gpu/gpu_lm.sh
corpus=${CORPUS:-stdlib}
for v in softmax linear hyla; do
  ${PYTHON:-python3} -m hyla train lm_small model.attention=$v name=lm_small_$v train.steps=$steps \
    "data.corpus=$corpus" ${EXTRA:-} \
    --device cuda --out "$out/$v" --quiet
done
${PYTHON:-python3} - "$out" <<'PY'
import json, sys, pathlib
root = pathlib.Path(sys.argv[1])
for run in sorted(p for p in root.iterdir() if (p / "metrics.jsonl").is_file()):
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r["split"] == "val"][-1]
    import math
    print(f"{run.name:10s} step {val['step']:6d}  val loss {val['loss']:.4f}  val ppl exp(mean loss) {math.exp(val['loss']):.2f}")
PY
