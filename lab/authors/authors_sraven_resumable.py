"""The authors' SRAVEN training (smonsays/hypernetwork-attention run.py), resumable.

Our code, not theirs: run with the authors' venv python (never imported by the ``hyla`` package), usually through
``lab/authors/authors_side_by_side.sh authors-sraven-resumable VARIANT SEED``. It builds their experiment exactly
as their run.py ``main()`` does and runs the body of their ``Experiment.run`` loop unchanged (same
``train_step``, same logging and evaluation, same step numbers in ``event.log``), but it walks the training
batches by index, drawing batch ``i`` as their ``SyntheticDataloader`` does (``sample_fn`` with
``fold_in(PRNGKey(seed), i)``), so a resumed run sees the same problems as an uninterrupted one.

State file: ``<log_dir>/resume.pkl`` = {"state": their ExperimentState, "next_index": next batch index,
"finished": bool, "config": the config after setup, "init_seed": ``--init_seed`` or None}, written atomically
every ``--save_every_minutes``, at ``--stop_after`` and on SIGTERM/SIGINT (after the current step, including its
evaluation, then exit 0; a signal that comes before the first step, during the imports, setup or compilation, is
acted on after that step). A run whose log_dir has it resumes from it and appends to ``event.log``. At the end of
the schedule, config.pkl and state.pkl are written as by their main(), but state.pkl holds the trained state
(theirs holds the initial one).

``--init_seed=I`` (a swap of #38 part 3): the initial state from ``PRNGKey(I)`` instead of ``PRNGKey(seed)``, that is
the initial weights and the random stream of attention dropout (their ``Experiment.reset`` splits both from that
key), while the held-out split, the training batches and the evaluation problems still follow ``--config.seed``.
Recorded in the state file; a resume with another value is refused.

``--dump_init=FILE.npz``: write the initial params (after ``--init_seed``) and exit without training, for
``lab/authors/authors_equivalence.py import-init`` (our training from their initial draw).

``--dump_trained=FILE.npz``: write the params of the state file in ``--config.log_dir`` (a run stopped or finished
by this driver) and exit, for ``lab/authors/authors_equivalence.py import-run`` (their trained model as a run
directory of ours, which ``hyla analyze`` reads).

``--stop_after=N``: stop after N updates, except that when loop step N is an evaluation step (their
``step % eval_every == 0`` on the loop index), loop step N is run too, so that its evaluation, logged as step
N + 1, is in the log; this is where ``authors_side_by_side.sh authors-sraven`` stopped their unmodified run.

Usage (flags as their run.py, plus --stop_after and --save_every_minutes)::

    AUTHORS_CODE=/work/authors/code JAX_PLATFORMS=cpu /work/authors/venv/bin/python \\
        lab/authors/authors_sraven_resumable.py "--config=configs/raven.py:raven_3x3_4features;linear_hypatt" \\
        --config.seed=0 --config.log_dir=DIR --eval_every=2500 --log_every=250 --logger=standard --stop_after=10000
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import tempfile
import time
import types
from typing import Any

STATE_FILE = "resume.pkl"
UNUSED_MODULES = ("tensorflow", "tensorflow_datasets", "tensorflow_text", "datasets", "sentencepiece", "wandb")


class _Inert:
    """Stands in for any attribute or call of a module that SRAVEN with --logger=standard never uses."""

    def __getattr__(self, name: str) -> _Inert:
        return _Inert()

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()


def stub_unused_modules() -> None:
    """Inert modules for the imports of run.py that an SRAVEN run never uses (as the shell launcher does)."""
    for name in UNUSED_MODULES:
        try:
            __import__(name)
        except ImportError:
            module = types.ModuleType(name)
            module.__getattr__ = lambda attr: _Inert()  # type: ignore[method-assign]
            sys.modules[name] = module


def import_their_run() -> types.ModuleType:
    """Their run.py as a module: importing it defines their absl flags (relative config paths need the chdir)."""
    code = os.environ.get("AUTHORS_CODE", "/work/authors/code")
    os.chdir(code)
    sys.path.insert(0, code)
    stub_unused_modules()
    import run  # type: ignore[import-not-found]

    return run


class StopRequest:
    """Records SIGTERM/SIGINT so that the loop can save after the step in progress instead of dying mid-step."""

    def __init__(self) -> None:
        self.signal: int | None = None
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal = signum


def save_atomically(log_dir: str, payload: dict[str, Any]) -> None:
    """Pickle to a temp file in log_dir, then rename: a kill during the write leaves the previous file intact."""
    fd, tmp = tempfile.mkstemp(prefix=STATE_FILE + ".", suffix=".tmp", dir=log_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(log_dir, STATE_FILE))
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def last_loop_index(stop_after: int | None, eval_every: int, num_batches: int) -> int:
    """The last loop index to run: N updates, or loop step N too when its evaluation is due (see module doc)."""
    if stop_after is None:
        return num_batches - 1
    last = stop_after if stop_after % eval_every == 0 else stop_after - 1
    return min(last, num_batches - 1)


def dump_params(path: str, params: Any, mixer: str) -> None:
    """Their flax params as a flat .npz (``a/b/c`` names, ``__mixer__`` = their sequence_mixer), which
    ``lab/authors/authors_equivalence.py import-init`` (or ``import-run``) turns into our weights."""
    import jax
    import numpy as np

    flat = {
        "/".join(str(getattr(k, "key", k)) for k in path_keys): np.asarray(leaf)
        for path_keys, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    np.savez(path, __mixer__=np.array(mixer), **flat)
    logging.info(f"wrote {len(flat)} params to {path}")


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys whose values differ between two nested config dicts (log_dir excluded: a run dir may be moved)."""
    out = []
    for key in sorted(set(saved) | set(current)):
        if key == "log_dir" and not prefix:
            continue
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: saved {a!r}, now {b!r}")
    return out


def main(argv: list[str]) -> int:
    # From the start: a signal during the imports, the setup or the first compilation (tens of seconds) is acted
    # on after the first step, so a run stopped that early still saves (at batch index start + 1).
    stop = StopRequest()
    run = import_their_run()
    import jax
    import jax.numpy as jnp
    import jax.tree_util as jtu
    from absl import flags
    from hyla.experiment import CallbackEvent  # type: ignore[import-not-found]
    from hyla.logging import StandardLogger  # type: ignore[import-not-found]

    flags.DEFINE_integer("stop_after", None, "Stop after this many updates (see the module docstring).")
    flags.DEFINE_float("save_every_minutes", 5.0, "Minutes between saves of <log_dir>/resume.pkl.")
    flags.DEFINE_integer("init_seed", None, "Initial weights and dropout stream from this seed.")
    flags.DEFINE_string("dump_init", None, "Write the initial params (flat a/b/c names) to this .npz and exit.")
    flags.DEFINE_string("dump_trained", None, "Write the params of log_dir's state file to this .npz and exit.")
    FLAGS = flags.FLAGS
    FLAGS(argv)

    # As run.py main(), less tf.config.experimental.set_visible_devices (tensorflow is a stub; CPU only).
    config = FLAGS.config
    assert config.name, "No config found."
    assert "raven" in config.name, "only their SRAVEN config is supported"
    assert config.seed is not None, "a resumable run needs a fixed --config.seed"
    assert config.log_dir, "a resumable run needs --config.log_dir"
    assert FLAGS.logger == ["standard"], "only --logger=standard is supported"

    if FLAGS.dump_trained:  # before their setup: only the state file and the config's mixer are needed
        with open(os.path.join(config.log_dir, STATE_FILE), "rb") as f:
            saved = pickle.load(f)
        dump_params(FLAGS.dump_trained, saved["state"].params["params"], config.model.sequence_mixer)
        logging.info(f"(the params after {saved['next_index']} updates of {config.log_dir})")
        return 0
    logger = [StandardLogger(config.log_dir)]
    logging.info(f"Logging to {config.log_dir}")
    # the grid point and model each log was trained with, in the log itself (their flags may override any)
    logging.info(
        f"Config: sequence_mixer={config.model.sequence_mixer} lr={config.lr} weight_decay={config.weight_decay} "
        f"warmup_steps={config.warmup_steps} seed={config.seed}"
    )
    # main() passes two RavenLatents callbacks with log_level=2; Experiment only triggers callbacks whose
    # log_level <= --log_level (default 1), so they never fire in their runs either, and none are made here.
    assert FLAGS.log_level < 2, "--log_level >= 2 would need main()'s RavenLatents callbacks"
    exp = run.setup(config, logger, callbacks=[])

    state_path = os.path.join(config.log_dir, STATE_FILE)
    if os.path.exists(state_path):
        with open(state_path, "rb") as f:
            saved = pickle.load(f)
        diff = config_differences(saved["config"], config.to_dict())
        if saved.get("init_seed") != FLAGS.init_seed:
            diff.append(f"--init_seed: saved {saved.get('init_seed')!r}, now {FLAGS.init_seed!r}")
        if diff:
            raise SystemExit(f"{state_path} was made with another config:\n  " + "\n  ".join(diff))
        exp_state, start = saved["state"], saved["next_index"]
        if saved["finished"]:
            logging.info("Resume: the schedule was already finished; nothing to do")
            return 0
        logging.info(f"Resuming at batch index {start} (step {int(exp_state.step)}) from {state_path}")
    else:
        init_seed = config.seed if FLAGS.init_seed is None else FLAGS.init_seed
        exp_state, start = exp.reset(jax.random.PRNGKey(init_seed)), 0
        if FLAGS.init_seed is not None:
            logging.info(f"Initial state from seed {init_seed}; split and batches from seed {config.seed}")
        if FLAGS.dump_init:
            dump_params(FLAGS.dump_init, exp_state.params["params"], config.model.sequence_mixer)
            return 0
        logging.info(f"Running on {jax.default_backend()}")
        logging.info(jtu.tree_map(jnp.shape, exp_state.params["params"]))
        exp.log(0, {"num_params": jax.flatten_util.ravel_pytree(exp_state.params["params"])[0].shape[0]})
        logging.info(f"Start training with parametrization:\n{config}")

    loader = exp.train_loader
    num_batches = len(loader)
    last = last_loop_index(FLAGS.stop_after, exp.eval_every, num_batches)
    if start > last:
        logging.info(f"Resume: batch index {start} is past --stop_after={FLAGS.stop_after}; nothing to do")
        return 0

    def save(next_index: int, finished: bool = False) -> None:
        payload = {
            "state": exp_state,
            "next_index": next_index,
            "finished": finished,
            "config": config.to_dict(),
            "init_seed": FLAGS.init_seed,
        }
        save_atomically(config.log_dir, payload)

    save_every_s = 60.0 * FLAGS.save_every_minutes
    last_save = time.monotonic()

    # Experiment.run, from batch index `start`; the START callbacks (none fire) are logged on a fresh start only,
    # so that a resumed run's event.log has the same lines as an uninterrupted one.
    if start == 0:
        exp.log(exp_state.step, exp.trigger_callback(exp_state, CallbackEvent.START), "callback")

    prev_time = time.time()
    for step in range(start, last + 1):
        batch = loader.sample_fn(jax.random.fold_in(loader.fixed_rng, step), loader.batch_size, loader.seq_len)
        exp_state, metrics = exp.train_step(exp_state, batch)

        if step % exp.log_every == 0:
            steps_per_sec = exp.log_every / (time.time() - prev_time)
            prev_time = time.time()
            metrics = {**metrics, "steps_per_sec": steps_per_sec}
            exp.log(exp_state.step, metrics, prefix="train")

        if step % exp.eval_every == 0:
            for name, eval_loader in exp.eval_loaders.items():
                exp.log(exp_state.step, exp.eval(exp_state, eval_loader), prefix=name)
            exp.log(exp_state.step, exp.trigger_callback(exp_state, CallbackEvent.STEP), "callback")

        if stop.signal is not None:
            save(step + 1)
            logging.info(f"Signal {stop.signal}: saved {state_path} at batch index {step + 1}; exiting")
            return 0
        if time.monotonic() - last_save >= save_every_s:
            save(step + 1)
            last_save = time.monotonic()

    if last < num_batches - 1:
        save(last + 1)
        logging.info(f"--stop_after={FLAGS.stop_after}: saved {state_path} at batch index {last + 1}")
        return 0

    # End of the schedule: Experiment.run's final evaluations, then main()'s save of config.pkl and state.pkl,
    # but of the trained state: their main() saves the state it passed to Experiment.run, which does not return
    # its updated state, so their state.pkl holds the initial parameters (step 0).
    for name, eval_loader in exp.eval_loaders.items():
        exp.log(exp_state.step, exp.eval(exp_state, eval_loader), prefix=name)
    exp.log(exp_state.step, exp.trigger_callback(exp_state, CallbackEvent.END), "callback")
    logging.info("Saving experiment state to disk ...")
    exp.save(exp_state)
    save(num_batches, finished=True)
    logging.info("...done")
    return 0


def run_main(argv: list[str]) -> int:
    """main(), after which SIGTERM/SIGINT are ignored: Python's shutdown puts back their default action, and a
    stop sent again after the state was saved (lab/gpu/gpu_sraven_verdict.sh repeats its SIGTERM until the
    process ends) would end the process with status 143."""
    try:
        return main(argv)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(run_main(sys.argv))
