"""Start or resume the evidence runs: one ``hyla sweep`` per CPU thread at a time, from a frozen worktree of a
commit (so edits to the checkout cannot reach a run mid-way), into this checkout's records, each thread working
through its list in ``lab/evidence_queue.yaml`` until the time budget is spent. An item is a sweep's arguments, or
``{next_seeds: ARGS}``: at its turn, ``lab/next_seeds.py ARGS`` (of the frozen commit) on the records so far, the
first sweep it prints, and the same again after each sweep (a finished seed can end a point's claim to the next)
until it prints none. Every sweep stops with checkpoints before the budget ends; finished runs are skipped, so the
next session runs the same command again.

    nohup python lab/evidence_queue.py --minutes 120 > /tmp/queue.log 2>&1 &
    python lab/evidence_queue.py --minutes 120 --dry-run        # the commands, nothing started
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TextIO

import yaml

LAB = Path(__file__).resolve().parent
REPO = LAB.parent
#: the same kernels and rounding on every x86 CPU the runs meet (Intel Xeon, AMD Zen 3 and Zen 5), so that a run's
#: pieces trained on different machines compute alike; one thread per run: one run per core
RUN_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "HYLA_CPU_MARCH": "x86-64-v3", "OMP_NUM_THREADS": "1"}
#: a sweep given less than this is not started (its first checkpoint would not come)
MIN_MINUTES = 3


def frozen_source(rev: str, repo: Path = REPO) -> Path:
    """The ``src`` of a detached worktree of ``rev`` beside the checkout ``repo``, made if missing."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    tree = repo.parent / f"{repo.name}-frozen-{sha}"
    if not tree.is_dir():
        subprocess.run(["git", "worktree", "add", "--quiet", "--detach", str(tree), sha], cwd=repo, check=True)
    return tree / "src"


#: an item that asks ``lab/next_seeds.py`` which seeds the records so far have earned
NEXT_SEEDS = "next_seeds"
Item = str | dict[str, str]


def bad_item(item: object) -> str | None:
    """Why ``item`` is not a queue item (None when it is one)."""
    if isinstance(item, str) or (isinstance(item, dict) and list(item) == [NEXT_SEEDS]):
        return None
    return f"expected a sweep's arguments or {{{NEXT_SEEDS}: ARGS}}, got {item!r}"


def sweep_command(item: str, minutes: int, root: Path) -> list[str]:
    budget = ["--max-minutes", str(minutes), "--root", str(root)]
    return [sys.executable, "-m", "hyla", "sweep", *shlex.split(item), "--jobs", "1", *budget]


def next_seeds_command(args: str, root: Path, src: Path) -> list[str]:
    """``lab/next_seeds.py`` of the tree ``src`` is in, on the records under ``root``."""
    return [sys.executable, str(src.parent / "lab" / "next_seeds.py"), *shlex.split(args), "--root", str(root)]


class Queue:
    """The threads' lists worked through side by side until ``deadline`` (``time.monotonic``)."""

    def __init__(self, threads: list[list[Item]], deadline: float, root: Path, src: Path, logs: Path) -> None:
        self.threads, self.deadline, self.root, self.src, self.logs = threads, deadline, root, src, logs
        self.env = {**os.environ, **RUN_ENV, "PYTHONPATH": str(src)}
        self.running: list[subprocess.Popen] = []
        self.stopping = threading.Event()
        self.failed: list[str] = []

    def minutes_left(self) -> int:
        return int((self.deadline - time.monotonic()) // 60)

    def work(self, index: int) -> None:
        with open(self.logs / f"thread-{index}.log", "a") as log:
            for item in self.threads[index]:
                if isinstance(item, dict):
                    self.train_earned(item[NEXT_SEEDS], log)
                elif (left := self.minutes_to_start(f"hyla sweep {item}", log)) is not None:
                    self.train(item, left, log)

    def minutes_to_start(self, label: str, log: TextIO) -> int | None:
        """The minutes left for what ``label`` names, or None (said in the log) when it must not start."""
        left = self.minutes_left()
        if self.stopping.is_set() or left < MIN_MINUTES:
            print(f"not started ({left} min left): {label}", file=log, flush=True)
            return None
        return left

    def train_earned(self, args: str, log: TextIO) -> None:
        """The first sweep ``lab/next_seeds.py ARGS`` prints, asked again after each, until it prints none, the
        budget is spent, a sweep fails, or it prints the sweep just trained again (that sweep could not finish)."""
        trained = None
        while sweeps := self.earned(args, log):
            if sweeps[0] == trained:
                print(f"asked no more: the sweep just trained is still unfinished: {trained}", file=log, flush=True)
                return
            if (left := self.minutes_to_start(f"hyla sweep {sweeps[0]}", log)) is None:
                return
            trained = sweeps[0]
            if not self.train(trained, left, log):
                return

    def earned(self, args: str, log: TextIO) -> list[str]:
        """The sweeps ``lab/next_seeds.py ARGS`` prints now (nothing once the budget is spent)."""
        if self.minutes_to_start(f"next_seeds.py {args}", log) is None:
            return []
        command = next_seeds_command(args, self.root, self.src)
        print(f"{time.strftime('%H:%M:%S')}: {shlex.join(command)}", file=log, flush=True)
        done = subprocess.run(command, cwd=REPO, env=self.env, capture_output=True, text=True)
        print(done.stdout + done.stderr, end="", file=log, flush=True)
        if done.returncode != 0:
            self.failed.append(f"exit {done.returncode}: next_seeds.py {args}")
            return []
        return [line.removeprefix("hyla sweep ") for line in done.stdout.splitlines() if line.startswith("hyla sweep ")]

    def train(self, sweep: str, minutes: int, log: TextIO) -> bool:
        """Whether the sweep exited cleanly (a budget's stop included)."""
        command = sweep_command(sweep, minutes, self.root)
        print(f"{time.strftime('%H:%M:%S')} {minutes} min: {shlex.join(command)}", file=log, flush=True)
        proc = subprocess.Popen(command, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.running.append(proc)
        if self.stopping.is_set():  # a signal that came while it started
            proc.terminate()
        ok = proc.wait() == 0
        if not ok:
            self.failed.append(f"exit {proc.returncode}: hyla sweep {sweep}")
        self.running.remove(proc)
        return ok

    def stop(self, signum: int, _frame: FrameType | None) -> None:
        """Pass the signal on: each sweep stops with checkpoints; nothing more starts."""
        self.stopping.set()
        for proc in list(self.running):
            proc.send_signal(signum)

    def run(self) -> int:
        workers = [threading.Thread(target=self.work, args=(i,)) for i in range(len(self.threads))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for line in self.failed:
            print(line, file=sys.stderr)
        return 1 if self.failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, required=True, help="the time budget; every sweep stops before it")
    parser.add_argument("--queue", type=Path, default=LAB / "evidence_queue.yaml")
    parser.add_argument("--root", type=Path, default=LAB / "runs", help="where the records go (default lab/runs)")
    parser.add_argument("--rev", default="HEAD", help="the commit the runs' code is frozen at (default HEAD)")
    parser.add_argument("--src", type=Path, help="train with this source tree instead of a frozen worktree")
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "hyla-evidence-queue")
    parser.add_argument("--dry-run", action="store_true", help="print each thread's commands; start nothing")
    args = parser.parse_args(argv)
    if args.minutes < MIN_MINUTES:
        print(f"--minutes must be at least {MIN_MINUTES}, got {args.minutes}", file=sys.stderr)
        return 2
    threads = yaml.safe_load(args.queue.read_text())["threads"]
    for index, items in enumerate(threads):
        for position, item in enumerate(items):
            if (why := bad_item(item)) is not None:
                print(f"{args.queue}: thread {index}, item {position}: {why}", file=sys.stderr)
                return 2
    if args.dry_run:
        env = " ".join(f"{k}={v}" for k, v in RUN_ENV.items())
        root = args.root.resolve()
        for index, items in enumerate(threads):
            print(
                f"thread {index} ({env} PYTHONPATH=<frozen {args.rev}>/src; --max-minutes: what is left at its start):"
            )
            for item in items:
                if isinstance(item, str):
                    print("  " + shlex.join(["python", *sweep_command(item, args.minutes, root)[1:]]))
                else:
                    command = next_seeds_command(item[NEXT_SEEDS], root, REPO / "src")
                    print("  " + shlex.join(["python", *command[1:]]) + "   # then its sweeps, asking again after each")
        return 0
    deadline = time.monotonic() + 60 * args.minutes
    src = args.src.resolve() if args.src else frozen_source(args.rev)
    args.logs.mkdir(parents=True, exist_ok=True)
    queue = Queue(threads, deadline, args.root.resolve(), src, args.logs)
    signal.signal(signal.SIGTERM, queue.stop)
    signal.signal(signal.SIGINT, queue.stop)
    print(f"{len(threads)} threads from {src}, logs in {args.logs}/thread-N.log, until {args.minutes} min pass")
    return queue.run()


if __name__ == "__main__":
    raise SystemExit(main())
