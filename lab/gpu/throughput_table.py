"""The throughput stage's results as one table: ``gpu_paper.sh``'s ``hyla bench train`` files (one per task and
stack size) and the authors' runs' logs, into ``OUT.json`` (what ``python lab/gpu/gpu_queue.py plan`` reads:
stack steps/s by task and size) and ``OUT.md``.

    python lab/gpu/throughput_table.py lab/tables/gpu_throughput lab/tables/gpu_throughput
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def collect(folder: Path) -> dict:
    """Stack steps/s, run-steps/s and peak memory by task and stack size; the authors' steps/s by processes."""
    tasks: dict[str, dict[str, float]] = {}
    rows = []
    device = None
    for path in sorted(folder.glob("*_stack*.json")):
        data = json.loads(path.read_text())
        device = device or data.get("device")
        for variant, r in data["variants"].items():
            if "error" in r:
                rows.append((data["task"], variant, data["seeds"], None, None, None, r["error"]))
                continue
            tasks.setdefault(data["task"], {})[str(data["seeds"])] = r["stacked_steps_per_s"]
            rows.append(
                (
                    data["task"],
                    variant,
                    data["seeds"],
                    r["stacked_steps_per_s"],
                    r["stacked_steps_per_s"] * data["seeds"],
                    r.get("peak_memory_gib_lone_and_stack"),
                    "",
                )
            )
    authors = {}
    for log in sorted(folder.glob("authors_*.log")):
        rates = [float(x) for x in re.findall(r"train_steps_per_sec this call: median ([0-9.]+)", log.read_text())]
        if rates:
            authors[log.stem.split("_")[1]] = rates
    return {"device": device, "tasks": tasks, "rows": rows, "authors": authors}


def markdown(table: dict) -> str:
    lines = [
        f"# GPU throughput against stack size ({table['device']})",
        "",
        "Written by `lab/gpu/throughput_table.py` from the throughput stage of `lab/gpu/gpu_paper.sh`.",
        "",
        "| task | variant | stack size | stack steps/s | run-steps/s (all runs) | peak GiB (lone + stack) | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, variant, size, rate, total, peak, note in table["rows"]:
        cells = [f"{rate:.0f}" if rate else "-", f"{total:.0f}" if total else "-", f"{peak:.2f}" if peak else "-"]
        lines.append(f"| {task} | {variant} | {size} | {' | '.join(cells)} | {note} |")
    lines += ["", "The authors' code (their driver, SRAVEN HYLA), median train_steps_per_sec of each process:", ""]
    for n, rates in table["authors"].items():
        lines.append(f"- {n} processes: {', '.join(f'{r:.0f}' for r in rates)} (all: {sum(rates):.0f} updates/s)")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: throughput_table.py FOLDER OUT (writes OUT.json and OUT.md)", file=sys.stderr)
        return 2
    table = collect(Path(argv[0]))
    out = Path(argv[1])
    if not table["tasks"]:
        print(f"{argv[0]}: no stack measured; {out}.json not written", file=sys.stderr)
        return 1
    out.with_suffix(".json").write_text(json.dumps({k: table[k] for k in ("device", "tasks", "authors")}, indent=1))
    out.with_suffix(".md").write_text(markdown(table))
    print(markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
