"""``hyla sweep --launcher slurm | submitit-local``: one submitit job per group, requeued when preempted."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hyla.sweep.groups import Group, plan_sweep, states_and_pending
from hyla.sweep.workers import train_groups
from hyla.train.sweeps import Sweep, load_sweep


def executor_parameters(slurm: dict[str, Any], device: str) -> dict[str, Any]:
    """submitit's parameters for one job from a sweep's ``slurm`` settings (default: 24 h, one GPU on CUDA)."""
    params: dict[str, Any] = {
        "timeout_min": int(slurm.get("time", 24 * 60)),
        "gpus_per_node": int(slurm.get("gpus", 1 if device.startswith("cuda") else 0)),
    }
    if "cpus" in slurm:
        params["cpus_per_task"] = int(slurm["cpus"])
    if "mem_gb" in slurm:
        params["mem_gb"] = slurm["mem_gb"]
    for key in ("partition", "account", "qos"):
        if key in slurm:
            params[f"slurm_{key}"] = slurm[key]  # AutoExecutor passes slurm_* to SLURM only
    return params


def submit(groups: list[Group], sweep: Sweep, root: Path, launcher: str, device: str, extra: list[str]) -> int:
    """One job per group (a stack of a row's runs, or a lone run) through submitit (``slurm``: a SLURM job
    array; ``submitit-local``: local processes), each asking what the sweep's ``slurm`` settings say; a
    preempted or timed-out job is requeued and resumes from its checkpoint. Returns the exit code."""
    try:
        import submitit
    except ImportError:
        print("hyla sweep: error: --launcher needs submitit (pip install 'hyla[sweep]')", file=sys.stderr)
        return 2
    try:
        executor = submitit.AutoExecutor(
            folder=str(root / "_submitit"), cluster="local" if launcher == "submitit-local" else "slurm"
        )
    except RuntimeError as err:  # e.g. no SLURM here: submitit says what it missed
        print(f"hyla sweep: error: --launcher {launcher}: {err}; use --launcher local here", file=sys.stderr)
        return 2
    executor.update_parameters(name=f"hyla_{sweep.name}", **executor_parameters(sweep.slurm, device))
    job = GroupJob(str(sweep.path), str(root), device, list(extra))
    jobs = executor.map_array(job, [group.names for group in groups])
    sizes = ", ".join(str(len(g.specs)) for g in groups)
    print(
        f"submitted {len(jobs)} jobs for {sum(len(g.specs) for g in groups)} runs ({launcher}; runs per job: "
        f"{sizes}): job ids {', '.join(j.job_id for j in jobs)}",
        flush=True,
    )
    if launcher == "submitit-local":
        for j in jobs:
            j.result()
    return 0


class GroupJob:
    """A submitit job: train one group of a sweep's runs (a stack or a lone run), resuming what is stopped.
    submitit calls ``checkpoint`` when the job is preempted or times out: the job is requeued as it
    is, and the runs continue from their newest checkpoint (``train.checkpoint_every``)."""

    def __init__(self, sweep_path: str, root: str, device: str, extra: list[str]) -> None:
        self.sweep_path, self.root, self.device, self.extra = sweep_path, root, device, extra

    def __call__(self, run_names: list[str]) -> list[str]:
        sweep = load_sweep(self.sweep_path)
        sweep.override(self.extra)
        out_root = Path(self.root)
        states, specs = states_and_pending([s for s in sweep.runs() if s.name in run_names], out_root)
        groups = plan_sweep(specs, sweep.configs, states, out_root)
        return train_groups(groups, out_root, device=self.device) if specs else []

    def checkpoint(self, run_names: list[str]) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, run_names)
