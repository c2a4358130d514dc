"""Train the golden runs: short CPU runs whose full ``metrics.jsonl`` the code must reproduce exactly.

``python tests/golden/run_golden.py OUT`` trains every run of ``GOLDEN`` into ``OUT/<name>`` from the
fully spelled-out configs in ``tests/golden/configs/`` (no ``base:``, every option written), so a
change to the paper configs never moves them. ``--write`` (only when a numerical change is intended
and explained in the commit) regenerates those configs from ``SPECS`` and the stored records.

Exact float equality needs the same arithmetic: one thread, and the AVX2 code paths of ATen, MKL and
oneDNN (``GOLDEN_ENV``), so the records hold on Intel and AMD machines alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS, RECORDS = HERE / "configs", HERE / "records"
#: the environment of every golden run (set before torch is imported: a subprocess)
GOLDEN_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "MKL_CBWR": "AVX2,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "PYTHONHASHSEED": "0",
}
TINY = [
    "model.num_layers=2",
    "model.emb_dim=16",
    "model.num_heads=4",
    "model.qk_dim=8",
    "model.v_dim=8",
    "model.mlp_dim=32",
    "train.steps=12",
    "train.eval_every=6",
    "train.eval_size=96",
    "train.eval_batch_size=48",
    "train.log_every=3",
    "train.checkpoint_every=6",
    "train.batch_size=16",
    "train.warmup_steps=3",
]
LIBRARY = ["data.split_seed=0", "model.attention_dropout=0", "model.init=torch", "train.cosine_end=steps"]
LIBRARY += ["train.weight_decay_mask=ndim", "model.relative_position_bidirectional=null", "model.norm_eps=1e-5"]
LIBRARY += ["model.gelu_approximate=none", "train.moe_aux_weight=0.01"]
#: name -> (base config, overrides, how it trains: lone | stacked seeds | stopped at a step and resumed)
SPECS: dict[str, tuple[str, list[str], str]] = {
    "fuzzy_hyla": ("fuzzy_logic", [*LIBRARY, "data.split_style=cover", "data.num_unseen_terms=2"], "lone"),
    "fuzzy_softmax": (
        "fuzzy_logic",
        [*LIBRARY, "data.split_style=cover", "data.num_unseen_terms=0", "model.attention=softmax"],
        "lone",
    ),
    "sraven_hyla": ("sraven", LIBRARY, "lone"),
    "sraven_softmax": ("sraven", [*LIBRARY, "model.attention=softmax"], "lone"),
    # the authors' setup as the paper configs use it today, spelled out
    "fuzzy_hyla_authors": ("fuzzy_logic", ["seed=1", "train.moe_aux_weight=0.01"], "lone"),
    "fuzzy_hyla_authors_resumed": ("fuzzy_logic", ["seed=1", "train.moe_aux_weight=0.01"], "stop@5"),
    # the same through the direct form (also at evaluation): its training steps are those of the
    # fuzzy_hyla_authors record from before the C kernel learned to drop (then, dropout meant the direct form)
    "fuzzy_hyla_authors_direct": (
        "fuzzy_logic",
        ["seed=1", "train.moe_aux_weight=0.01", "model.attention_backend=direct"],
        "lone",
    ),
    "sraven_hyla_stacked": ("sraven", LIBRARY, "seeds 0,1,2"),
    "fuzzy_moe": ("fuzzy_logic", [*LIBRARY, "model.moe_experts=3", "model.moe_top_k=2"], "lone"),
}


def train(name: str, out: Path) -> None:
    """Train golden run ``name`` into ``out`` from its stored config (in this process)."""
    from hyla.cli import main

    how = SPECS[name][2]
    config = str(CONFIGS / f"{name}.yaml")
    if how == "lone":
        code = main(["train", config, "--out", str(out), "--quiet"])
    elif how.startswith("seeds "):
        code = main(["train", config, "--seeds", how.split()[1], "--out", str(out), "--quiet"])
    else:
        step = how.removeprefix("stop@")
        code = main(["train", config, "--out", str(out), "--quiet", "--stop-at-step", step])
        code = code or main(["train", config, "--out", str(out), "--quiet", "--resume"])
    if code != 0:
        raise SystemExit(f"golden run {name} failed with exit code {code}")


def run_all(out: Path, names: list[str] | None = None) -> None:
    """Train the golden runs in a fresh process with :data:`GOLDEN_ENV` (torch reads it at import)."""
    env = {**os.environ, **GOLDEN_ENV}
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(Path(__file__)), "--in-process", str(out), *(names or [])]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)


def metrics_files(root: Path) -> dict[str, str]:
    """``relative path -> metrics.jsonl text`` of every run under ``root``."""
    return {str(p.parent.relative_to(root)): p.read_text() for p in sorted(root.rglob("metrics.jsonl"))}


def write() -> None:
    from hyla.train.config import dump_config, load_config

    CONFIGS.mkdir(exist_ok=True)
    for name, (base, overrides, _) in SPECS.items():
        cfg = load_config(base, [*TINY, *overrides, f"name=golden_{name}"])
        (CONFIGS / f"{name}.yaml").write_text(
            "# golden run: every option spelled out (tests/golden/run_golden.py); do not edit by hand\n"
            + dump_config(cfg)
        )
    if RECORDS.exists():
        shutil.rmtree(RECORDS)
    run_all(RECORDS)
    for ckpt in RECORDS.rglob("checkpoints"):
        shutil.rmtree(ckpt)
    for tb in RECORDS.rglob("tb"):
        shutil.rmtree(tb)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", type=Path)
    p.add_argument("names", nargs="*")
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--write", action="store_true", help="regenerate tests/golden/configs and records")
    args = p.parse_args()
    if args.write:
        write()
    elif args.in_process:
        for name in args.names or SPECS:
            train(name, args.out / name)
    else:
        run_all(args.out, args.names)


if __name__ == "__main__":
    main()
