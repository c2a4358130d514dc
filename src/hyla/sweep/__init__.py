"""``hyla sweep FILE``: a grid of runs you can stop and continue anywhere, recorded in the repository.

A sweep file (``hyla/configs/sweeps/*.yaml``, one per paper experiment; format in
``hyla.train.sweeps``) names rows x grid x seeds over a base config. Run
``ROW-lr0.001-weight_decay0.1-seed0`` trains into ``ROOT/<sweep name>/<run>/`` (ROOT: ``results/sweeps``):
``config.yaml`` and the metrics (``hyla.train.run.folder``) are the record (committed); ``made_by.jsonl``
says which commit, machine and device trained which steps and for how long; checkpoints and ``tb/`` stay local
(``.gitignore``). Order: the ``first`` rows, then by grid point, seed and row. A finished run (its
last evaluation written) is never rerun; a stopped one resumes from its checkpoint. Runs that the
stacked trainer can stack (same everything but seed, split and optimizer hyperparameters) and that start
together (all new, or stopped at the same step) train as one stack (``hyla.train.sweeps``, the planner
``hyla train --seeds`` uses too). ``--max-minutes`` stops with checkpoints before the budget ends.
``--jobs K`` trains K runs (or stacks) at a time in K worker processes that share the cores (each
``cores // K`` threads), each taking the next run in the order above; a worker's progress goes to
``<run>/train.log``. One ``hyla sweep`` at a time per record directory: a second one exits at once naming
the first's pid (a lock per sweep folder and per run folder, ``hyla.train.run.lock``).

Modules: ``groups`` (a sweep's runs as groups; one group trained as one recorded piece),
``workers`` (groups in turn or over worker processes; signals and the deadline),
``estimate`` (``--dry-run``: the cost), ``launch`` (submitit / SLURM),
``cli`` (the command line).
"""
