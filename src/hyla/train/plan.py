"""Which runs train together and with which engine: the one planner of ``hyla train`` and ``hyla sweep``.

Runs form one stack when the stacked engine can stack them (``hyla.train.stacked.stack_key``: same
config but seed, held-out split, data seed and optimizer hyperparameters) and they start together: all new,
or all resuming from checkpoints of the same step (a stack stopped together continues together; runs stopped
at different steps resume one by one). A group of one run trains with the lone engine, the reference; a
group of two or more with the stacked one (``engine_for``). ``describe_plan`` says how they train.
"""

from __future__ import annotations

from hyla.train.config import ExperimentConfig


def engine_for(cfgs: list[ExperimentConfig]) -> str:
    """The engine of one group of ``plan_groups``: ``lone`` for one run, else ``stacked``. A stack of
    one equals its lone run bit for bit with the loop forward, so the lone engine (DDP, its own CUDA
    graph) is the one to use."""
    return "lone" if len(cfgs) == 1 else "stacked"


def plan_groups(
    cfgs: list[ExperimentConfig], resume_from: list[int | None] | None = None, max_stack: int | None = None
) -> list[list[int]]:
    """Indices of ``cfgs`` as the groups they train in, in order of each group's first run.
    ``resume_from[i]``: the checkpoint step run ``i`` resumes from, None for a new run (default: all new);
    ``max_stack``: a stack of more runs is cut into consecutive stacks of at most that many."""
    if max_stack is not None and max_stack < 1:
        raise ValueError(f"max_stack must be >= 1, got {max_stack}")
    from hyla.train.stacked import stack_key

    starts = resume_from if resume_from is not None else [None] * len(cfgs)
    if len(starts) != len(cfgs):
        raise ValueError(f"resume_from must hold one step per run: {len(cfgs)} runs, {len(starts)} steps")
    groups: dict[tuple[int | None, str | int], list[int]] = {}
    for i, (cfg, start) in enumerate(zip(cfgs, starts)):
        key = stack_key(cfg)
        groups.setdefault((start, i if key is None else key), []).append(i)
    cap = max_stack or len(cfgs) or 1
    return [group[k : k + cap] for group in groups.values() for k in range(0, len(group), cap)]


#: the largest stack a sweep trains unless told otherwise (``hyla sweep --max-stack``): 1, each run alone. On a
#: CPU a stack of R runs costs about R lone steps (the loop forward); on an H100 a stack of 3 SRAVEN runs
#: trained 124 steps/s (372 run-steps/s), one run alone 567. Runs one after
#: another also finish, and land their records, one by one, instead of all at the end or none under a budget.
SWEEP_MAX_STACK = 1


def describe_plan(groups: list[list[ExperimentConfig]], cap: int | None = None) -> str:
    """The planner's line on groups of ``plan_groups`` (stacks of at most ``cap`` runs): how many, and why
    the runs are not one stack."""
    from hyla.train.stacked import not_stackable_reason, stack_differences

    runs = [cfg for group in groups for cfg in group]
    if len(groups) == 1:
        return f"{len(runs)} runs in one stack" if len(runs) > 1 else "1 run"
    reasons = sorted({reason for cfg in runs if (reason := not_stackable_reason(cfg))})
    if cap is not None and any(len(g) == cap for g in groups):
        reasons.append("each run alone: --max-stack 1" if cap == 1 else f"stacks of at most {cap}: --max-stack")
    if differ := stack_differences(runs):
        reasons.append(f"they differ in {', '.join(differ)}")
    why = "; ".join(reasons) or "their checkpoints are at different steps"  # the one other cause
    return f"{len(runs)} runs in {len(groups)} groups ({why})"
