"""Collect the side-by-side fuzzy-logic curves (lab/authors/authors_side_by_side.sh) into one JSON file.

Reads the authors' StandardLogger logs (``AUTHORS_LOGS/<variant>-seed<S>/event.log``) and our
``OURS_RUNS/<setup>/<variant>-seed<S>/metrics.jsonl`` and writes ``lab/tables/side_by_side/curves.json``;
prints a markdown table of mean +- standard error over seeds of r2 on our ``ood`` split per eval step.

Split names are OURS throughout. The authors' eval split ``test`` (held-out pairs of the 12 seen terms) is
our ``ood``; their ``ood`` (pairs of two of the 4 excluded terms) is our ``unseen_terms``; their ``train_*``
line is the metrics of the training batch at that step (our ``train_batch``). Their steps are as logged:
the number of updates made (evaluation at loop step k is logged as k + 1, so 1, 501, 1001 and the final
1100); their numbers are printed with 4 decimals, so they are read back at that precision.

Usage: .venv/bin/python lab/authors/side_by_side.py [--authors-logs DIR] [--ours-runs DIR] [--out FILE]
       [--keep lab/tables/side_by_side/curves.json]  # keep the runs made in earlier sessions
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from hyla.train.run.folder import read_run

REPO = Path(__file__).resolve().parents[2]
THEIR_SPLITS = {"test": "ood", "ood": "unseen_terms", "train": "train_batch"}
LINE = re.compile(r"\]\s*step:\s*(\d+)\s*(.*)$")
PAIR = re.compile(r"([A-Za-z0-9_]+):\s*(-?[0-9.]+(?:e[-+]?\d+)?|nan|-?inf)")
RUN_DIR = re.compile(r"^(?P<variant>[a-z_]+)-seed(?P<seed>\d+)$")
STACKED_DIR = re.compile(r"^(?P<variant>[a-z_]+)-stacked$")
COMMANDS = [
    "AUTHORS_CODE=/work/authors/code AUTHORS_VENV=/work/authors/venv lab/authors/authors_side_by_side.sh venv",
    "lab/authors/authors_side_by_side.sh authors VARIANT SEED  # their run.py via a stub launcher (the script)",
    "lab/authors/authors_side_by_side.sh ours SETUP VARIANT SEED  # hyla train fuzzy_logic ... --out DIR",
    "lab/authors/authors_side_by_side.sh ours-stacked SETUP VARIANT 0,1,2  # hyla train ... --seeds 0,1,2",
    ".venv/bin/python lab/authors/side_by_side.py",
]


def parse_authors_log(
    path: Path, splits: dict[str, str] = THEIR_SPLITS, metrics: tuple[str, ...] = ("r2", "loss")
) -> list[dict[str, Any]]:
    """Curve points from their event.log: one per (step, split) that has the first of ``metrics``; their
    prefixes are renamed by ``splits`` (theirs -> ours), other prefixes are skipped."""
    points: dict[tuple[int, str], dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        m = LINE.search(line)
        if not m:
            continue
        step = int(m.group(1))
        for key, value in PAIR.findall(m.group(2)):
            prefix, _, metric = key.partition("_")
            split = splits.get(prefix)
            if split is None or metric not in metrics:
                continue
            points.setdefault((step, split), {"step": step, "split": split})[metric] = float(value)
    return [p for _, p in sorted(points.items()) if metrics[0] in p]


def parse_ours(run_dir: Path) -> list[dict[str, Any]]:
    """Curve points from our run directory's metrics (every split that has an r2)."""
    out = []
    for rec in read_run(run_dir).metrics:
        if "r2" not in rec or "split" not in rec:
            continue
        point = {"step": int(rec["step"]), "split": rec["split"], "r2": float(rec["r2"])}
        if "loss" in rec:
            point["loss"] = float(rec["loss"])
        out.append(point)
    return out


def _git(args: list[str]) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def authors_commit(code: Path, mirror: Path | None) -> str | None:
    """Commit of their checkout: its own git, else the mirror it was archived from."""
    found = _git(["-C", str(code), "rev-parse", "HEAD"])
    if found is None and mirror is not None and mirror.exists():
        found = _git(["--git-dir", str(mirror), "rev-parse", "HEAD"])
    return found


def machine() -> str:
    from hyla.runtime import cpu_model  # here: importing hyla imports torch, which collecting does not need

    return f"{platform.system()} {platform.release()}, {os.cpu_count()} CPU cores ({cpu_model()}), no GPU"


def collect(authors_logs: Path, ours_runs: Path, steps: int) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    if authors_logs.exists():
        for d in sorted(authors_logs.iterdir()):
            m = RUN_DIR.match(d.name)
            log = d / "event.log"
            if not m or not log.exists():
                continue
            curve = parse_authors_log(log)
            runs.append(
                {
                    "code": "authors",
                    "setup": "authors",
                    "variant": m["variant"],
                    "seed": int(m["seed"]),
                    "complete": (d / "done").exists(),
                    "curve": curve,
                }
            )
    if ours_runs.exists():
        for setup_dir in sorted(p for p in ours_runs.iterdir() if p.is_dir()):
            found: list[tuple[str, int, Path, bool]] = []
            for d in sorted(setup_dir.iterdir()):
                m = RUN_DIR.match(d.name)
                s = STACKED_DIR.match(d.name)
                if m and (d / "metrics.jsonl").exists():
                    found.append((m["variant"], int(m["seed"]), d, False))
                elif s:  # --seeds 0,1,2: one stacked model, OUT/seedN/metrics.jsonl per seed
                    for sub in sorted(d.glob("seed*/metrics.jsonl")):
                        found.append((s["variant"], int(sub.parent.name[4:]), sub.parent, True))
            for variant, seed, run_dir, stacked in found:
                curve = parse_ours(run_dir)
                done = any(p["step"] == steps and p["split"] == "ood" for p in curve)
                runs.append(
                    {
                        "code": "hyla",
                        "setup": setup_dir.name,
                        "variant": variant,
                        "seed": seed,
                        "stacked": stacked,
                        "complete": done,
                        "curve": curve,
                    }
                )
    return runs


def run_key(run: dict[str, Any]) -> tuple[str, str, str, int]:
    return run["code"], run["setup"], run["variant"], run["seed"]


def carried_over(path: Path, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of the curves file ``path`` that ``found`` does not hold, each tagged with the ``collected``
    record (date, commits, machine) of the file it came from, unless it has one already."""
    earlier = json.loads(path.read_text())
    collected = {k: earlier["meta"].get(k) for k in ("date", "machine", "hyla_commit", "authors_commit")}
    have = {run_key(run) for run in found}
    return [
        {**run, "collected": run.get("collected", collected)} for run in earlier["runs"] if run_key(run) not in have
    ]


def table(runs: list[dict[str, Any]], split: str, eval_every: int) -> str:
    """Markdown: mean +- s.e. over seeds of r2 on `split` at each eval step, per (code, setup, variant).

    The authors' periodic evaluations (logged at k * eval_every + 1) are listed at k * eval_every, k >= 1."""
    groups: dict[tuple[str, str, str], dict[int, list[float]]] = {}
    for run in runs:
        key = (run["code"], run["setup"], run["variant"])
        for p in run["curve"]:
            if p["split"] == split:
                step = p["step"]
                if run["code"] == "authors" and step > 1 and (step - 1) % eval_every == 0:
                    step -= 1
                groups.setdefault(key, {}).setdefault(step, []).append(p["r2"])
    lines = [f"| code | setup | variant | step: r2 on `{split}` (mean +- s.e., n seeds) |", "|---|---|---|---|"]
    for (code, setup, variant), by_step in sorted(groups.items()):
        cells = []
        for step, vals in sorted(by_step.items()):
            arr = np.asarray(vals, dtype=float)
            se = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else float("nan")
            cells.append(f"{step}: {arr.mean():.3f} +- {se:.3f} (n={arr.size})")
        lines.append(f"| {code} | {setup} | {variant} | " + "; ".join(cells) + " |")
    return "\n".join(lines)


def per_seed(runs: list[dict[str, Any]], split: str) -> str:
    """Markdown: each run's r2 on `split` at each of its eval steps (steps as logged)."""
    lines = [f"| code | setup | variant | seed | r2 on `{split}` at step (as logged) |", "|---|---|---|---|---|"]
    for run in sorted(runs, key=lambda r: (r["code"], r["setup"], r["variant"], r["seed"])):
        cells = [f"{p['step']}: {p['r2']:.4f}" for p in run["curve"] if p["split"] == split]
        head = f"| {run['code']} | {run['setup']} | {run['variant']} | {run['seed']} | "
        lines.append(head + "; ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors-logs", type=Path, default=REPO / "runs/side_by_side/authors")
    ap.add_argument("--ours-runs", type=Path, default=REPO / "runs/side_by_side/hyla")
    ap.add_argument("--authors-code", type=Path, default=Path(os.environ.get("AUTHORS_CODE", "/work/authors/code")))
    ap.add_argument("--authors-mirror", type=Path, default=Path("/work/.mirror/smonsays+hypernetwork-attention/repo"))
    ap.add_argument("--steps", type=int, default=int(os.environ.get("STEPS", "1100")))
    ap.add_argument("--eval-every", type=int, default=int(os.environ.get("EVAL_EVERY", "500")))
    ap.add_argument("--out", type=Path, default=REPO / "lab/tables/side_by_side/curves.json")
    ap.add_argument(
        "--keep",
        type=Path,
        metavar="CURVES.json",
        help="carry over the runs of an earlier curves file that are not found in the run folders (made "
        "elsewhere or removed since); each keeps the date, commits and machine it was collected with",
    )
    args = ap.parse_args()

    runs = collect(args.authors_logs, args.ours_runs, args.steps)
    if args.keep is not None:
        runs = carried_over(args.keep, runs) + runs
    meta = {
        "commands": COMMANDS,
        "machine": machine(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "authors_commit": authors_commit(args.authors_code, args.authors_mirror),
        "hyla_commit": _git(["-C", str(REPO), "rev-parse", "HEAD"]),
        "steps": args.steps,
        "eval_every": args.eval_every,
        "splits": "ours: ood = held-out pairs of seen terms (their 'test'); unseen_terms = their 'ood'",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    print(f"wrote {args.out} ({len(runs)} runs)\n")
    for split in ("ood", "unseen_terms"):
        print(table(runs, split, args.eval_every) + "\n")
    for split in ("ood", "unseen_terms"):
        print(per_seed(runs, split) + "\n")


if __name__ == "__main__":
    main()
