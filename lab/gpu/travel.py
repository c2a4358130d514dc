"""The device call's working tree under the device tool's 64 MiB: only what the named queue stages read travels.

The tracked records outgrew that limit (``lab/runs`` keeps every run's weights). ``slim`` moves the checkout to a
local branch, never pushed, on which each tracked file the stages do not read is untracked and ignored (it stays
on disk, unchanged); ``back`` returns to the branch it came from, where they are tracked again, after checking
that none of them changed, and deletes the branch. What travels of ``lab/runs``: the record (``RECORD_FILES``) of
every run of the sweeps the stages train, and the whole folder of each of their runs not finished (its newest
checkpoint); no other sweep, and not the authors' logs of ``lab/tables/gpu_sraven_verdict/authors/``.

    python lab/gpu/travel.py slim --stages "sraven-selected authors fuzzy" --carry .gpu_state .authors
    run(command="REPORT=0 STAGES='sraven-selected authors fuzzy' MINUTES=9 bash lab/gpu/gpu_paper.sh", ...)
    python lab/gpu/travel.py back        # then unpack the call's archive and commit its records as usual

Make the paper report here (``REPORT=0`` there): on the slim tree it would miss the sweeps left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import gpu_queue as queue

from hyla.train.run.folder import RECORD_FILES, run_state
from hyla.train.sweeps import load_sweep

#: what the device tool sends at most: tracked and untracked-not-ignored files, and the carried paths
LIMIT_BYTES = 64 * 2**20
BRANCH = "gpu-travel"
AUTHORS_LOGS = "lab/tables/gpu_sraven_verdict/authors/"
BEGIN, END = "# gpu-travel: begin (lab/gpu/travel.py back removes this block)", "# gpu-travel: end"


def git(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["git", *args], input=stdin, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {args[0]}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def git_path(name: str) -> Path:
    return Path(git("rev-parse", "--git-path", name).strip())


def tracked() -> list[str]:
    return [p for p in git("ls-files", "-z").split("\0") if p]


def sweeps_read_by(stages: list[str], fuzzy: str, sraven: str) -> set[str]:
    """The names of the sweeps the stages train (their record folders under the root)."""
    files = {"fuzzy": fuzzy, "sraven": sraven}
    return {load_sweep(files[s.sweep]).name for s in map(queue.stage_named, stages) if s.sweep is not None}


def stays_behind(paths: list[str], root: str, sweeps: set[str]) -> list[str]:
    """The tracked ``paths`` that the stages training ``sweeps`` (records under ``root``) do not read."""
    behind, states = [], {}
    prefix = root.rstrip("/") + "/"
    for path in paths:
        if path.startswith(AUTHORS_LOGS):
            behind.append(path)
            continue
        if not path.startswith(prefix):
            continue
        parts = path[len(prefix) :].split("/")
        if parts[0] not in sweeps:
            behind.append(path)
            continue
        if len(parts) < 3:  # a file of the sweep folder itself
            continue
        run = Path(prefix, parts[0], parts[1])
        if run not in states:
            states[run] = run_state(run)
        if states[run] == "done" and not (len(parts) == 3 and parts[2] in RECORD_FILES):
            behind.append(path)
    return behind


def bytes_of(paths: list[str]) -> int:
    total = 0
    for path in map(Path, paths):
        if path.is_dir():
            total += sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
        elif path.is_file():
            total += path.stat().st_size
    return total


def travel_bytes(carry: list[str]) -> int:
    """What the device tool would send now: tracked files, untracked ones not ignored, and ``carry``."""
    untracked = [p for p in git("ls-files", "-z", "--others", "--exclude-standard").split("\0") if p]
    return bytes_of([*tracked(), *untracked, *carry])


def ignore_pattern(path: str) -> str:
    """``path`` as one anchored, literal ignore pattern."""
    escaped = "".join("\\" + c if c in "\\*?[]!# " else c for c in path)
    return "/" + escaped


def exclude_without_block(text: str) -> str:
    lines, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == BEGIN:
            inside = True
        elif line.rstrip("\n") == END:
            inside = False
        elif not inside:
            lines.append(line)
    return "".join(lines)


def slim(stages: list[str], carry: list[str], root: str, fuzzy: str, sraven: str) -> int:
    state_file = git_path(f"{BRANCH}.json")
    if state_file.exists():
        raise ValueError(f"the tree is slim already ({state_file}): run `python lab/gpu/travel.py back` first")
    if git("branch", "--list", BRANCH).strip():
        raise ValueError(f"a branch {BRANCH} exists without a slim tree: delete it (git branch -D {BRANCH})")
    dirty = git("status", "--porcelain", "--untracked-files=all").splitlines()
    if dirty:
        raise ValueError(
            f"the tree has changes ({len(dirty)}, e.g. {dirty[0].strip()!r}): commit the records first "
            "(python lab/stage_records.py), so that nothing left behind can be lost"
        )
    origin = git("symbolic-ref", "--quiet", "--short", "HEAD").strip()
    behind = stays_behind(tracked(), root, sweeps_read_by(stages, fuzzy, sraven))
    state_file.write_text(json.dumps({"from": origin, "commit": git("rev-parse", "HEAD").strip(), "behind": behind}))
    git("switch", "--quiet", "-c", BRANCH)
    exclude = git_path("info/exclude")
    exclude.parent.mkdir(parents=True, exist_ok=True)
    kept = exclude_without_block(exclude.read_text()) if exclude.exists() else ""
    block = "\n".join([BEGIN, *map(ignore_pattern, behind), END])
    exclude.write_text(kept + ("" if not kept or kept.endswith("\n") else "\n") + block + "\n")
    if behind:
        git("--literal-pathspecs", "rm", "-q", "--cached", "--pathspec-from-file=-", "--pathspec-file-nul",
            stdin="\0".join(behind))  # fmt: skip
    identity = {k: BRANCH for k in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME")}
    identity |= {k: f"{BRANCH}@localhost" for k in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL")}
    git("commit", "-q", "--allow-empty", "-m", f"{BRANCH}: {len(behind)} files left behind (local)", env=identity)
    size = travel_bytes(carry)
    print(f"slim: on branch {BRANCH}, {len(behind)} tracked files left behind (on disk, ignored)")
    print(f"travels: {size / 2**20:.1f} MiB of {LIMIT_BYTES / 2**20:.0f} (carried paths included: {carry or 'none'})")
    if size > LIMIT_BYTES:
        back()
        raise ValueError(f"{size / 2**20:.1f} MiB would travel, over {LIMIT_BYTES / 2**20:.0f}: back on {origin}")
    print(f"next: the device call (REPORT=0), then `python lab/gpu/travel.py back` (returns to {origin})")
    return 0


def back() -> int:
    state_file = git_path(f"{BRANCH}.json")
    if not state_file.exists():
        raise ValueError("no slim tree to return from (python lab/gpu/travel.py slim makes one)")
    state = json.loads(state_file.read_text())
    behind: list[str] = state["behind"]
    if behind:
        stored = {}
        for line in git("ls-tree", "-r", "-z", state["commit"]).split("\0"):
            if line:
                meta, path = line.split("\t", 1)
                stored[path] = meta.split()[2]
        present = [p for p in behind if Path(p).is_file()]
        now = dict(zip(present, git("hash-object", "--stdin-paths", stdin="\n".join(present)).split(), strict=True))
        changed = [p for p in behind if now.get(p) != stored.get(p)]
        if changed:
            raise ValueError(
                f"{len(changed)} files left behind changed or went missing (e.g. {changed[0]}): the switch back "
                f"would overwrite them; save them, restore {state['commit'][:12]}'s copies, then run back again"
            )
    on_branch = git("symbolic-ref", "--quiet", "--short", "HEAD").strip() == BRANCH
    if on_branch and git("rev-parse", "HEAD").strip() == state["commit"]:
        git("reset", "--quiet")  # slim stopped before its commit: its staged removals must not reach the origin
    git("switch", "--quiet", state["from"])
    exclude = git_path("info/exclude")
    if exclude.exists():
        exclude.write_text(exclude_without_block(exclude.read_text()))
    if git("branch", "--list", BRANCH).strip():  # absent where slim failed before making it
        git("branch", "-q", "-D", BRANCH)
    state_file.unlink()
    print(f"back on {state['from']}: {len(behind)} files tracked again; the call's records are changes to commit")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python lab/gpu/travel.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    sl = sub.add_parser("slim", help="a local branch on which only what the stages read is tracked")
    sl.add_argument("--stages", default=" ".join(queue.DEFAULT_STAGES), help="space-separated stage names")
    sl.add_argument("--carry", nargs="*", default=[], help="the paths the call carries (they count too)")
    sl.add_argument("--root", default=str(queue.RECORD_ROOT), help="where the sweep records are (default lab/runs)")
    sl.add_argument("--fuzzy", default="table_a1_fuzzy", help="the fuzzy-logic sweep file")
    sl.add_argument("--sraven", default="table_a1_sraven", help="the SRAVEN sweep file")
    sub.add_parser("back", help="the branch slim came from, every file tracked again")
    args = p.parse_args(argv)
    try:
        if args.what == "back":
            return back()
        return slim(args.stages.split(), args.carry, args.root, args.fuzzy, args.sraven)
    except (ValueError, RuntimeError) as err:
        print(f"travel: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
