"""Stage the sweep records of lab/runs for a commit, each run as its state asks, and say how many bytes it adds.

    python lab/stage_records.py                         # every run under lab/runs
    python lab/stage_records.py lab/runs/table_a1_fuzzy  # one sweep's runs (or one run's folder)
    python lab/stage_records.py --dry-run               # what it would stage, nothing staged

A finished run keeps its record and final weights (no checkpoint: its weights are the model, and a checkpoint's
optimizer state is several times their size); a stopped run keeps its record and its newest checkpoint only, to
resume from; older checkpoints leave the index (other tracked files stay). A run still training (its folder
locked) is left alone: stage it after it stops. A submission's size is capped, so the bytes each run adds are
printed: a checkpoint replaced in every commit counts each time, which is why records are staged once, when the
runs have stopped.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hyla.train.run.checkpoint import CheckpointError, latest_checkpoint, sums_file
from hyla.train.run.folder import CONFIG, FINAL_WEIGHTS, run_state
from hyla.train.run.folder import RECORD_FILES as RUN_RECORD
from hyla.train.run.lock import FolderLock

LAB = Path(__file__).resolve().parent
REPO = LAB.parent
RUNS = LAB / "runs"
#: a run's record: what every state keeps (the tokenizer: a text task's, which its weights need)
RECORD_FILES = (*RUN_RECORD, "tokenizer.json")


@dataclass
class Staging:
    run: Path
    state: str
    keep: list[Path] = field(default_factory=list)
    drop: list[Path] = field(default_factory=list)
    added_bytes: int = 0


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def run_folders(paths: list[Path]) -> list[Path]:
    """The run folders (those with a ``config.yaml``) at or one level under each of ``paths``."""
    found = []
    for path in paths:
        if (path / CONFIG).is_file():
            found.append(path)
        else:
            found += sorted(p.parent for p in path.glob(f"*/{CONFIG}"))
            found += sorted(p.parent for p in path.glob(f"*/*/{CONFIG}"))
    return sorted(set(found))


def in_training(run: Path) -> bool:
    try:
        with FolderLock(run, "lab/stage_records.py", "the run directory"):
            return False
    except ValueError:  # FolderInUseError: a live process holds it
        return True


def plan(run: Path) -> Staging:
    """What ``run`` keeps in the index and what leaves it."""
    state = run_state(run)
    keep = [run / name for name in RECORD_FILES if (run / name).is_file()]
    if state == "done":
        keep += [p for p in (run / FINAL_WEIGHTS, sums_file(run / FINAL_WEIGHTS)) if p.is_file()]
    elif state == "stopped":
        newest = latest_checkpoint(run)
        assert newest is not None
        keep += [newest.parent / "latest", *sorted(p for p in newest.iterdir() if p.is_file())]
    tracked = [REPO / line for line in git("ls-files", "--", str(run.relative_to(REPO))).splitlines()]
    kept = set(keep)
    # older checkpoints leave the index (other tracked files, e.g. a refit's note, stay)
    drop = [p for p in tracked if p not in kept and (run / "checkpoints") in p.parents]
    head = {
        line.split("\t")[1]: line.split()[2]
        for line in git("ls-tree", "-r", "HEAD", "--", str(run.relative_to(REPO))).splitlines()
    }
    rels = [str(path.relative_to(REPO)) for path in keep]
    blobs = git("hash-object", "--", *rels).split()  # one git call for all of them
    added = sum(path.stat().st_size for path, rel, blob in zip(keep, rels, blobs) if head.get(rel) != blob)
    return Staging(run, state, keep, drop, added)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="sweep or run folders (default: lab/runs)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be staged; stage nothing")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.paths] or [RUNS]
    for path in paths:
        if not path.is_dir() or not path.is_relative_to(REPO):
            print(f"stage_records: error: {path} is not a folder inside {REPO}", file=sys.stderr)
            return 2
    total = 0
    for run in run_folders(paths):
        name = run.relative_to(REPO)
        if in_training(run):
            print(f"{name}: in training (its folder is locked); left alone")
            continue
        try:
            staging = plan(run)
        except CheckpointError as err:
            print(f"{name}: left alone: {err}")
            continue
        if not args.dry_run:
            git("add", "-f", "--", *(str(p.relative_to(REPO)) for p in staging.keep))
            if staging.drop:
                git("rm", "-q", "--cached", "--", *(str(p.relative_to(REPO)) for p in staging.drop))
        total += staging.added_bytes
        if staging.added_bytes or staging.drop:
            print(
                f"{name}: {staging.state}, {len(staging.keep)} files kept "
                f"({staging.added_bytes / 2**20:.1f} MiB new), {len(staging.drop)} leave the index"
            )
    print(f"{'would stage' if args.dry_run else 'staged'}: {total / 2**20:.1f} MiB of new or changed files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
