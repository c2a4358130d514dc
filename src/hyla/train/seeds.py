"""Every seed training derives from a config's seeds, in one place.

A run's random streams all follow from ``seed``, ``train.data_seed`` and ``train.eval_seed``:

* the model's initial draw: torch's default generator of the device, seeded ``model_seed(seed)``
  (``hyla.train.build.build_model``). A lone run's attention dropout draws on from that same generator;
  a stacked run's own dropout generator starts as a copy of it, so it drops the pairs its lone run drops;
* the training problems: one generator per run and process, seeded ``data_stream_seed`` of the run's data
  seed (``train.data_seed``, else ``default_data_seed(seed)``) and the process's rank;
* the evaluation problems: split ``i`` from a generator seeded ``eval_split_seed(eval_seed, i)``, the same
  for every run and every evaluation.

These values are what every committed record and checkpoint was trained with: changing one changes every
run's numbers and breaks resuming them (``tests/train/test_seeds.py`` pins them). They are computed once,
at setup, never per step.
"""

from __future__ import annotations

#: the seed of the two problems a CUDA run's model is first called on eagerly, before it is compiled (the
#: fused kernel's self-test); a generator of its own, so no run's streams move
KERNEL_CHECK_SEED = 0


def model_seed(seed: int) -> int:
    """The seed of torch's default generator before the model's initial draw (and a run's attention dropout
    after it): the run's ``seed`` itself."""
    return seed


def default_data_seed(seed: int) -> int:
    """The data seed of a run whose config gives no ``train.data_seed``: far from ``seed`` itself, so the data
    stream and the model's draw do not start alike."""
    return 1_000_003 * (seed + 1)


def data_stream_seed(data_seed: int, rank: int, restarted_at_step: int = 0) -> int:
    """The seed of a run's training-problem generator on process ``rank`` (each DDP process draws its own
    part of the batch). ``restarted_at_step > 0``: the stream begun anew at that step, when a checkpoint's
    generator state cannot go on on this device type (``hyla.train.run.checkpoint.restore_generator``), so that
    every such resume draws alike."""
    seed = data_seed * 1009 + rank
    return seed if restarted_at_step == 0 else seed * 1_000_003 + restarted_at_step


def eval_split_seed(eval_seed: int, split_index: int) -> int:
    """The seed of the evaluation problems of split ``split_index`` (in the task's ``splits`` order): the same
    problems at every evaluation and for every run, stacked or alone."""
    return eval_seed * 101 + split_index
