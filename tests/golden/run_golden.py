"""Train the golden runs: short CPU runs whose full ``metrics.jsonl`` the code must reproduce exactly.

``python tests/golden/run_golden.py OUT`` trains every run of ``GOLDEN`` into ``OUT/<name>`` from the
fully spelled-out configs in ``tests/golden/configs/`` (no ``base:``, every option written), so a
change to the paper configs never moves them. ``--write`` (only when a numerical change is intended
and explained in the commit) regenerates those configs from ``SPECS`` and the stored records.

Exact float equality needs the same arithmetic. ``GOLDEN_ENV`` pins what can be pinned (one thread;
the AVX2 code paths of ATen, MKL and oneDNN; the C kernel built for ``x86-64-v3``), but the compiler, the
torch build and the CPU still decide the last digits. So every set of runs writes its
:func:`fingerprint` beside its records (``FINGERPRINT.json``): where it equals the stored one the records
must come back bit for bit, elsewhere within the noise floor that ``--noise`` measures (the spread of
the same runs over other dispatch paths; ``tests/golden/NOISE.md``). A variable already set in the
environment wins over ``GOLDEN_ENV`` (and shows in the fingerprint), so the runs can be tried on
other dispatch paths: ``ATEN_CPU_CAPABILITY=default make test-portable``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
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
    # the C kernel's vectorized sums follow its -march target: not the build machine's (x86-64 only)
    **({"HYLA_CPU_MARCH": "x86-64-v3"} if platform.machine() in ("x86_64", "AMD64") else {}),
}
FINGERPRINT = "FINGERPRINT.json"
#: ``--noise``: the dispatch paths the golden runs are retrained on, each against GOLDEN_ENV (None: unset)
DISPATCH_VARIANTS: dict[str, dict[str, str | None]] = {
    "aten_default": {"ATEN_CPU_CAPABILITY": "default"},
    "aten_native": {"ATEN_CPU_CAPABILITY": None},
    "mkl_onednn_native": {"MKL_ENABLE_INSTRUCTIONS": None, "MKL_CBWR": None, "ONEDNN_MAX_CPU_ISA": None},
    "kernel_native": {"HYLA_CPU_MARCH": "native"},
    "two_threads": {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"},
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


def cpu_fingerprint() -> dict[str, str]:
    """The CPU's model name and a hash of its feature flags."""
    from hyla.runtime import cpu_model, cpuinfo_field  # here: importing hyla imports torch

    flags = cpuinfo_field("flags")
    return {"model": cpu_model(), "flags": hashlib.sha256(flags.encode()).hexdigest()[:16] if flags else ""}


def fingerprint() -> dict[str, object]:
    """What decides the last digits of a golden run in this process: CPU, torch build, threads,
    dispatch settings and the C compiler."""
    import torch

    from hyla.cpu import blas_path
    from hyla.ops import clib as wrapper
    from hyla.ops.gelu import gelu_path
    from hyla.ops.moe import moe_path
    from hyla.runtime import c_compiler_version

    try:
        wrapper.load_library()
        kernel = "built"
    except Exception as err:
        kernel = f"unavailable: {err}"
    compiler = wrapper._compiler()
    cc = c_compiler_version(compiler) if compiler else ""
    return {
        "cpu": cpu_fingerprint(),
        "torch": torch.__version__,
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "env": {key: os.environ.get(key) for key in sorted({*GOLDEN_ENV, "HYLA_CPU_MARCH"})},
        "c_compiler": cc.splitlines()[0] if cc else None,
        "c_flags": list(wrapper.build_flags()),
        "c_kernel": kernel,
        "blas": blas_path(),  # MKL's kernels chosen by CPU vendor or overridden (hyla.cpu)
        "gelu": gelu_path(),  # a tanh GELU by the C kernel or by torch (HYLA_FAST_GELU)
        "moe": moe_path(),  # MoE experts on their routed tokens or on all (HYLA_MOE_DISPATCH)
    }


def read_fingerprint(root: Path) -> dict[str, object] | None:
    path = root / FINGERPRINT
    return json.loads(path.read_text()) if path.exists() else None


def metric_rows(text: str) -> list[dict[str, float]]:
    return [json.loads(line) for line in text.splitlines()]


#: logged for comparison with the authors' logs, not a result: the gradient's norm carries the rounding of its
#: near-zero entries (a vmap stack moved it 4.4e-4 from its lone runs by step 3, where the losses moved < 1e-4),
#: so comparisons within a tolerance check that it is there, not its digits; exact comparisons include it
ROUNDING_SENSITIVE = {"grad_norm"}
#: fractions of answers decided by an argmax: a change of rounding flips a near-tie, and the tiny runs' early
#: models (near chance) have many. Within a tolerance they may differ by up to ARGMAX_ATOL (absolute; one
#: answer in 64 is 0.016: a vmap stack flipped 1 of 256 SRAVEN answer features at step 3, where its losses
#: moved 1e-6); beyond that they count like any other number. The losses, which carry the same
#: predictions as continuous numbers, keep the tolerance.
ARGMAX_DECIDED = {"acc", "feature_acc"}
ARGMAX_ATOL = 0.02


def relative_deviations(ours: str, golden: str) -> list[tuple[int, str, str, float]]:
    """``(step, split, key, |ours - golden| / |golden|)`` for every number (but :data:`ROUNDING_SENSITIVE`; 0 for
    an :data:`ARGMAX_DECIDED` one within :data:`ARGMAX_ATOL`) of
    two ``metrics.jsonl`` texts whose rows name the same steps, splits and keys (AssertionError if they do not)."""
    mine, theirs = metric_rows(ours), metric_rows(golden)
    shape = [[(r["step"], r["split"], sorted(r)) for r in rows] for rows in (mine, theirs)]
    assert shape[0] == shape[1], "the runs logged different steps, splits or keys"
    out = []
    for a, b in zip(mine, theirs):
        for key in sorted(set(a) - {"step", "split"} - ROUNDING_SENSITIVE):
            gap = abs(a[key] - b[key])
            if key in ARGMAX_DECIDED and gap <= ARGMAX_ATOL:
                gap = 0.0
            out.append((a["step"], a["split"], key, gap / max(abs(b[key]), 1e-12)))
    return out


def noise(out: Path) -> str:
    """Train the golden runs with GOLDEN_ENV and on each of :data:`DISPATCH_VARIANTS`; a markdown table
    of the largest relative deviation from the GOLDEN_ENV runs, per variant and per step."""
    run_all(out / "base")
    base = metrics_files(out / "base")
    worst: dict[str, dict[int, float]] = {}
    for variant, changes in DISPATCH_VARIANTS.items():
        run_all(out / variant, changes=changes)
        theirs = metrics_files(out / variant)
        per_step = worst.setdefault(variant, {})
        for name in base:
            for step, _, _, dev in relative_deviations(theirs[name], base[name]):
                per_step[step] = max(per_step.get(step, 0.0), dev)
    steps = sorted({s for d in worst.values() for s in d})
    lines = ["| dispatch path | " + " | ".join(f"step {s}" for s in steps) + " |"]
    lines.append("|---|" + "---|" * len(steps))
    for variant, per_step in worst.items():
        lines.append(f"| {variant} | " + " | ".join(f"{per_step.get(s, 0.0):.1e}" for s in steps) + " |")
    return "\n".join(lines)


def compare(theirs_root: Path, ours_root: Path = RECORDS) -> str:
    """A markdown table of the largest relative deviation per step of every golden run under ``theirs_root``
    from the same run under ``ours_root`` (default: the records), e.g. records of another commit or machine:
    ``git archive COMMIT tests/golden/records | tar -x -C /tmp/old`` then
    ``run_golden.py --compare /tmp/old/tests/golden/records``."""
    ours, theirs = metrics_files(ours_root), metrics_files(theirs_root)
    worst: dict[str, dict[int, float]] = {}
    for name in sorted(set(ours) & set(theirs)):
        per_step = worst.setdefault(name, {})
        for step, _, _, dev in relative_deviations(theirs[name], ours[name]):
            per_step[step] = max(per_step.get(step, 0.0), dev)
    steps = sorted({s for d in worst.values() for s in d})
    lines = ["| run | " + " | ".join(f"step {s}" for s in steps) + " | largest |", "|---|" + "---|" * (len(steps) + 1)]
    for name, per_step in worst.items():
        cells = [f"{per_step.get(s, 0.0):.1e}" for s in steps]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {max(per_step.values(), default=0.0):.1e} |")
    missing = sorted(set(ours) ^ set(theirs))
    return "\n".join(lines) + (f"\n\nin one set only: {', '.join(missing)}" if missing else "")


def golden_env(changes: dict[str, str | None] | None = None) -> dict[str, str]:
    """The environment of the golden runs: this one, with :data:`GOLDEN_ENV` where it sets nothing,
    then ``changes`` (None removes a variable)."""
    env = {**GOLDEN_ENV, **os.environ}
    for key, value in (changes or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def subprocess_env(changes: dict[str, str | None] | None = None) -> dict[str, str]:
    """:func:`golden_env` with this checkout's ``src`` first on the path."""
    env = golden_env(changes)
    env["PYTHONPATH"] = str(HERE.parents[1] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_all(out: Path, names: list[str] | None = None, changes: dict[str, str | None] | None = None) -> None:
    """Train the golden runs in a fresh process with :func:`golden_env` (torch reads it at import);
    ``out/FINGERPRINT.json`` says where they ran."""
    cmd = [sys.executable, str(Path(__file__)), "--in-process", str(out), *(names or [])]
    subprocess.run(cmd, env=subprocess_env(changes), check=True, stdout=subprocess.DEVNULL)


def fingerprint_of_golden_env() -> dict[str, object]:
    """:func:`fingerprint` of a fresh process with :func:`golden_env`, without training."""
    cmd = [sys.executable, str(Path(__file__)), "--fingerprint"]
    return json.loads(subprocess.run(cmd, env=subprocess_env(), check=True, capture_output=True, text=True).stdout)


def metrics_files(root: Path) -> dict[str, str]:
    """``relative path -> metrics.jsonl text`` of every run under ``root``."""
    return {str(p.parent.relative_to(root)): p.read_text() for p in sorted(root.rglob("metrics.jsonl"))}


def write(configs: bool = True) -> None:
    """Regenerate the stored configs from the paper configs (unless ``configs`` is false: then the records
    are retrained from the stored ones, e.g. when the training logs a new key) and the records."""
    import yaml

    from hyla.train.config import dump_config, load_config

    CONFIGS.mkdir(exist_ok=True)
    for name, (base, overrides, _) in SPECS.items() if configs else ():
        text = "# golden run: every option spelled out (tests/golden/run_golden.py); do not edit by hand\n"
        text += dump_config(load_config(base, [*TINY, *overrides, f"name=golden_{name}"]))
        path = CONFIGS / f"{name}.yaml"
        if not path.exists() or yaml.safe_load(path.read_text()) != yaml.safe_load(text):  # keep key order
            path.write_text(text)
    if RECORDS.exists():
        shutil.rmtree(RECORDS)
    run_all(RECORDS)
    for ckpt in RECORDS.rglob("checkpoints"):
        shutil.rmtree(ckpt)
    for tb in RECORDS.rglob("tb"):
        shutil.rmtree(tb)
    for weights in RECORDS.rglob("model.safetensors"):  # the records are the metrics; weights are not compared
        weights.unlink()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", type=Path)
    p.add_argument("names", nargs="*")
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fingerprint", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--write", action="store_true", help="regenerate tests/golden/configs and records")
    p.add_argument("--write-records", action="store_true", help="retrain the records from the stored configs")
    p.add_argument("--noise", action="store_true", help="print the spread of the runs over other dispatch paths")
    p.add_argument("--compare", action="store_true", help="OUT's runs against the records: largest deviation per step")
    args = p.parse_args()
    if args.write or args.write_records:
        write(configs=args.write)
    elif args.compare:
        print(compare(args.out))
    elif args.noise:
        print(noise(args.out))
    elif args.fingerprint:
        print(json.dumps(fingerprint()))
    elif args.in_process:
        for name in args.names or SPECS:
            train(name, args.out / name)
        (args.out / FINGERPRINT).write_text(json.dumps(fingerprint(), indent=1) + "\n")
    else:
        run_all(args.out, args.names)


if __name__ == "__main__":
    main()
