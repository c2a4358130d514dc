"""Our SRAVEN training and the authors' as one trajectory: same initial weights, same batches, step by step.

``authors_equivalence.py`` shows that the two codes compute the same loss, gradients and a few AdamW updates
from one state. This script trains both for many steps from the same start and compares them after every
update, to find the first step where they part (issue #38, part 3):

- the same initial weights (ours, copied into their flax layout);
- the same training batches (our generator's, written to a file and fed to theirs);
- each code's own optimizer and schedule (theirs: optax as their ``run.py`` builds it);
- attention dropout off (its draws cannot match across libraries) and, with ``--float64``, both in float64:
  then equal code gives trajectories that agree to rounding for a long time, and a part that differs shows as
  a jump of the difference at the step where it first acts.

Three steps, since their code needs its own environment (JAX, flax; never a dependency of ours)::

    .venv/bin/python lab/authors/trajectory_sraven.py ours --steps 1500 --float64 --out DIR
    XLA_FLAGS=--xla_disable_hlo_passes=onednn-matmul-rewriter PYTHONPATH=$AUTHORS_CODE \\
        $AUTHORS_VENV/bin/python lab/authors/trajectory_sraven.py theirs --out DIR
    .venv/bin/python lab/authors/trajectory_sraven.py compare --out DIR [--json FILE]

``ours`` writes ``ours_batches.npz`` (initial weights in their layout, the batches as uint8) and
``ours_steps.npz`` (per update: loss, gradient norm, parameter norm; the parameters after the updates in
:func:`snapshot_steps`); ``theirs`` writes ``theirs_steps.npz`` alike; ``compare`` prints, per update, the
relative difference of the loss and of the parameters, and the first update where it exceeds ``--part``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
from authors_equivalence import MIXERS, their_model, to_their_layout


def snapshot_steps(steps: int) -> list[int]:
    """Updates after which the parameters are kept: 1-10, then every 10 to 100, every 50 after that."""
    keep = set(range(1, 11)) | set(range(10, 101, 10)) | set(range(50, steps + 1, 50)) | {steps}
    return sorted(s for s in keep if s <= steps)


def flat(params: dict[str, np.ndarray]) -> np.ndarray:
    """All parameters as one float64 vector, in name order."""
    return np.concatenate([np.asarray(params[k], np.float64).reshape(-1) for k in sorted(params)])


def as_full_masks(masks: list[Any], seq_len: int) -> np.ndarray:
    """Our keep-masks of one update (``1 x 1 x Q x K`` per layer; the last layer's Q is the answer positions)
    as ``L x T x T`` bools for their model, which computes every query: the last rows of the last layer are
    ours, the others (queries whose outputs no loss reads) keep everything."""
    full = np.ones((len(masks), seq_len, seq_len), dtype=bool)
    for i, m in enumerate(masks):
        m_QxK = m.reshape(m.shape[-2], m.shape[-1]).numpy()
        full[i, seq_len - m_QxK.shape[0] :] = m_QxK
    return full


def ours(args: argparse.Namespace) -> None:
    import torch

    from hyla.attention.functional import draw_keep_mask
    from hyla.train.build import build_model, build_task
    from hyla.train.config import config_with_overrides, load_config
    from hyla.train.engines.base import global_norms_R
    from hyla.train.engines.optim import build_optimizer, lr_at
    from hyla.train.run.checkpoint import load_checkpoint
    from hyla.train.seeds import data_stream_seed

    torch.set_num_threads(1)
    overrides = [] if args.dropout else ["model.attention_dropout=0"]
    overrides += [f"model.attention_backend={args.backend}", *args.set]
    start = load_checkpoint(args.start) if args.start is not None else None
    if start is None:
        cfg = load_config("sraven", [f"model.attention={args.variant}", f"seed={args.seed}", *overrides])
    else:  # the run's own config (its schedule, seed, attention), with the comparison's overrides
        cfg = config_with_overrides(start.config, overrides)
        if cfg.data.task != "sraven" or cfg.model.attention not in MIXERS:
            raise ValueError(f"--start {args.start}: a SRAVEN run of one of {sorted(MIXERS)} is needed")
    task = build_task(cfg, None)
    model = build_model(cfg, task)
    dtype = torch.float64 if args.float64 else torch.float32
    if start is not None:
        model.load_state_dict(start.model)
    model = model.to(dtype).train()
    layout = {"num_layers": cfg.model.num_layers, "num_heads": cfg.model.num_heads}
    state0 = to_their_layout({k: v.detach().numpy().copy() for k, v in model.state_dict().items()}, **layout)
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    gen = torch.Generator().manual_seed(data_stream_seed(cfg.data_seed, rank=0))  # the engine's, on rank 0
    drop_gen = torch.Generator().manual_seed(cfg.seed)
    start_step, adam = 0, {}
    if start is not None:  # AdamW's moments and step count (cast to the parameters' dtype) and the run's batches
        optimizer.load_state_dict(start.optimizer)
        gen.set_state(start.rng["data_rank0"].to(torch.uint8))
        start_step = start.step
        named = dict(model.named_parameters())
        for moment, key in (("mu", "exp_avg"), ("nu", "exp_avg_sq")):
            by_name = {n: optimizer.state[p][key].numpy().copy() for n, p in named.items()}
            adam |= {f"{moment}/{k}": v for k, v in to_their_layout(by_name, **layout).items()}
    mask_shapes = model.dropout_mask_shapes(task.seq_len, task.num_output_positions) if args.dropout else []
    keeps: list[np.ndarray] = []  # per update, every layer's keep-mask as T x T (theirs computes every query)
    keep = set(snapshot_steps(args.steps))
    xs, ys, losses, grad_norms, param_norms, lrs, snaps = [], [], [], [], [], [], {}
    began = time.perf_counter()
    for i in range(args.steps):
        step = start_step + i  # as LoneEngine.train_step makes update step + 1
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = task.sample(cfg.train.batch_size, "train", gen)
        optimizer.zero_grad(set_to_none=True)
        masks = [
            draw_keep_mask(q, k, cfg.model.attention_dropout, torch.device("cpu"), drop_gen) for q, k in mask_shapes
        ]
        out = model(batch.inputs.to(dtype), last_positions=task.num_output_positions, dropout_keeps=masks or None)
        loss = task.loss(out, batch)
        if masks:
            keeps.append(as_full_masks(masks, task.seq_len))
        loss.backward()
        grad_norms.append(float(global_norms_R([p.grad.unsqueeze(0) for p in model.parameters()])))
        optimizer.step()
        param_norms.append(float(global_norms_R([p.unsqueeze(0) for p in model.parameters()])))
        losses.append(loss.item())
        lrs.append(lr)
        xs.append(batch.inputs.numpy().astype(np.uint8))
        ys.append(batch.targets.numpy().astype(np.int8))
        if i + 1 in keep:
            now = to_their_layout({k: v.detach().numpy() for k, v in model.state_dict().items()}, **layout)
            snaps[i + 1] = flat(now)
        if (i + 1) % 100 == 0:
            print(f"ours: {i + 1}/{args.steps} loss {loss.item():.6f} ({time.perf_counter() - began:.0f} s)")
    args.out.mkdir(parents=True, exist_ok=True)
    save_steps(args.out / f"{args.name}_steps.npz", losses, grad_norms, param_norms, lrs, snaps, start_step)
    if args.name != "ours":  # a control run of ours (e.g. another backend) on the batches of "ours"
        print(f"wrote {args.out}/{args.name}_steps.npz")
        return
    np.savez(
        args.out / "ours_batches.npz",
        x=np.stack(xs),
        y=np.stack(ys),
        mixer=np.array(MIXERS[cfg.model.attention]),
        float64=np.bool_(args.float64),
        steps=np.int64(cfg.train.steps),
        peak_lr=np.float64(cfg.train.lr),
        warmup_steps=np.int64(cfg.train.warmup_steps),
        weight_decay=np.float64(cfg.train.weight_decay),
        start_step=np.int64(start_step),
        **adam,
        **({"keep": np.stack(keeps)} if keeps else {}),
        **{f"param/{k}": v for k, v in state0.items()},
    )
    updates = f"updates {start_step + 1}-{start_step + args.steps}"
    print(f"wrote {args.out}/ours_*.npz: {updates} of {cfg.model.attention}, seed {cfg.seed}")


def save_steps(
    path: Path,
    losses: list[float],
    grad_norms: list[float],
    param_norms: list[float],
    lrs: list[float],
    snaps: dict[int, np.ndarray],
    start_step: int,
) -> None:
    """One code's trajectory: per update (index i = update ``start_step + i + 1``) and the kept parameter
    vectors (keyed by the update's index within the window, 1 = the first)."""
    np.savez(
        path,
        start_step=np.int64(start_step),
        loss=np.array(losses),
        grad_norm=np.array(grad_norms),
        param_norm=np.array(param_norms),
        lr=np.array(lrs),
        snap_steps=np.array(sorted(snaps), dtype=np.int64),
        snaps=np.stack([snaps[s] for s in sorted(snaps)]),
    )


def theirs(args: argparse.Namespace) -> None:
    import jax
    import jax.numpy as jnp
    import optax
    from flax.traverse_util import flatten_dict, unflatten_dict

    with np.load(args.out / "ours_batches.npz") as z:
        data = dict(z)
    float64 = bool(data["float64"])
    model, cfg = their_model(str(data["mixer"]), float64=float64)
    dtype = jnp.float64 if float64 else jnp.float32
    params = unflatten_dict(
        {k[len("param/") :]: jnp.asarray(v, dtype) for k, v in data.items() if k.startswith("param/")}, sep="/"
    )
    # their run.py's optimizer, with their schedule over the run's length, at the run's lr / wd / warmup
    steps, warmup, peak = int(data["steps"]), int(data["warmup_steps"]), float(data["peak_lr"])
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=warmup, decay_steps=steps - warmup, end_value=peak * 0.1
    )
    # Inside their jitted update the schedule reads optax's int32 step count, so it computes in float32 even
    # under jax_enable_x64 (lr 9.99987e-7 instead of 1e-6 at update 2: 1.3e-5 relative). That is their code as
    # it runs; --float64-schedule casts the count first, so that a float64 comparison tests everything else.
    learning_rate = (lambda count: schedule(count.astype(jnp.float64))) if args.float64_schedule else schedule
    optimizer = optax.adamw(
        learning_rate=learning_rate,
        weight_decay=float(data["weight_decay"]),
        mask=lambda p: jax.tree_util.tree_map(lambda x: x.ndim != 1, p),
    )
    num_features = cfg.data.num_features
    keep_masks = data.get("keep")
    supplied: list[Any] = []
    if keep_masks is not None:  # their dropout draws its mask with random.bernoulli: it gets ours, layer by layer
        from hyla.models import attention as attention_module

        attention_module.random = types.SimpleNamespace(bernoulli=lambda key, p, shape: supplied.pop(0).reshape(shape))

    def loss_fn(p: Any, x: Any, y: Any, keep_LxTxT: Any) -> Any:  # their SymbolicRavenLoss
        if keep_masks is None:  # attention dropout off
            logits = model.apply({"params": p}, x, deterministic=True)
        else:
            supplied[:] = list(keep_LxTxT)
            logits = model.apply({"params": p}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(0)})
            assert not supplied, "their model used fewer dropout masks than supplied"
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, -num_features:], y).mean()

    @jax.jit
    def step(p: Any, opt_state: Any, x: Any, y: Any, keep_LxTxT: Any) -> tuple[Any, Any, Any, Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y, keep_LxTxT)
        updates, opt_state = optimizer.update(grads, opt_state, p)
        p = optax.apply_updates(p, updates)
        return p, opt_state, loss, optax.global_norm(grads), optax.global_norm(p)

    start_step = int(data["start_step"])
    opt_state = optimizer.init(params)
    if start_step:  # our AdamW state: its moments, and the count that the Adam and schedule states share
        moments = {}
        for m in ("mu", "nu"):
            flat_m = {k[len(m) + 1 :]: jnp.asarray(v, dtype) for k, v in data.items() if k.startswith(f"{m}/")}
            moments[m] = unflatten_dict(flat_m, sep="/")
        count = jnp.asarray(start_step, jnp.int32)

        def restore(s: Any) -> Any:
            if isinstance(s, optax.ScaleByAdamState):
                return s._replace(count=count, mu=moments["mu"], nu=moments["nu"])
            return s._replace(count=count) if isinstance(s, optax.ScaleByScheduleState) else s

        kinds = (optax.ScaleByAdamState, optax.ScaleByScheduleState)
        opt_state = jax.tree_util.tree_map(restore, opt_state, is_leaf=lambda s: isinstance(s, kinds))
    keep = set(snapshot_steps(len(data["x"])))
    losses, grad_norms, param_norms, lrs, snaps = [], [], [], [], {}
    start = time.perf_counter()
    for i, (x, y) in enumerate(zip(data["x"], data["y"])):
        lrs.append(float(learning_rate(jnp.asarray(start_step + i, jnp.int32))))  # as the update computes it
        keep_i = jnp.asarray(keep_masks[i]) if keep_masks is not None else jnp.zeros(())
        params, opt_state, loss, grad_norm, param_norm = step(
            params, opt_state, jnp.asarray(x, dtype), jnp.asarray(y, jnp.int32), keep_i
        )
        losses.append(float(loss))
        grad_norms.append(float(grad_norm))
        param_norms.append(float(param_norm))
        if i + 1 in keep:
            snaps[i + 1] = flat({k: np.asarray(v) for k, v in flatten_dict(params, sep="/").items()})
        if (i + 1) % 100 == 0:
            print(f"{args.name}: {i + 1}/{len(data['x'])} loss {float(loss):.6f} ({time.perf_counter() - start:.0f} s)")
    save_steps(args.out / f"{args.name}_steps.npz", losses, grad_norms, param_norms, lrs, snaps, start_step)
    print(f"wrote {args.out}/{args.name}_steps.npz")


def compare(args: argparse.Namespace) -> int:
    with np.load(args.out / f"{args.a}_steps.npz") as a, np.load(args.out / f"{args.b}_steps.npz") as b:
        ours_, theirs_ = dict(a), dict(b)
    n = min(len(ours_["loss"]), len(theirs_["loss"]))

    def rel(key: str) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.abs(ours_[key][:n] - theirs_[key][:n]) / np.abs(theirs_[key][:n])

    loss_rel, lr_rel = rel("loss"), rel("lr")
    lr_rel[~np.isfinite(lr_rel)] = 0.0  # the first learning rate is 0 in both
    snap_steps = [int(s) for s in ours_["snap_steps"] if s <= n]
    param_rel = {}
    for s in snap_steps:
        pa = ours_["snaps"][list(ours_["snap_steps"]).index(s)]
        pb = theirs_["snaps"][list(theirs_["snap_steps"]).index(s)]
        param_rel[s] = float(np.linalg.norm(pa - pb) / np.linalg.norm(pb))
    parted = next((i + 1 for i, r in enumerate(loss_rel) if r > args.part), None)
    start_step = int(ours_["start_step"])
    if start_step != int(theirs_["start_step"]):
        raise ValueError(f"{args.a} starts after update {start_step}, {args.b} after {int(theirs_['start_step'])}")
    print(f"{args.a} vs {args.b}: {n} updates compared, {start_step + 1}-{start_step + n}; the table counts from 1")
    print(f"largest learning-rate difference {lr_rel.max():.1e}")
    print(f"first update whose loss differs by more than {args.part:.0e} (relative): {parted or 'none'}\n")
    print(f"| update | loss {args.a} | loss {args.b} | loss rel. diff | params rel. L2 diff |\n|---|---|---|---|---|")
    for s in snap_steps:
        print(
            f"| {s} | {ours_['loss'][s - 1]:.6f} | {theirs_['loss'][s - 1]:.6f} | {loss_rel[s - 1]:.1e} |"
            f" {param_rel[s]:.1e} |"
        )
    if args.json is not None:
        record = {
            "updates": n,
            "start_step": start_step,
            "first_update_parted": parted,
            "part_threshold": args.part,
            "max_lr_rel_diff": float(lr_rel.max()),
            args.a: {k: [float(v) for v in ours_[k][:n]] for k in ("loss", "grad_norm", "param_norm")},
            args.b: {k: [float(v) for v in theirs_[k][:n]] for k in ("loss", "grad_norm", "param_norm")},
            "params_rel_l2_diff": {str(s): v for s, v in param_rel.items()},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
        print(f"\nwrote {args.json}")
    return 0


def summary(args: argparse.Namespace) -> int:
    """One line per ``compare --json`` record: the window, the pair, the largest relative loss difference, the
    parameters' relative L2 difference at the window's end, and the first update that parted."""
    print("| record | updates | pair | loss, largest rel. diff | parameters, rel. L2 diff at the end | parted at |")
    print("|---|---|---|---|---|---|")
    for path in sorted(args.records):
        record = json.loads(path.read_text())
        a, b = (k for k in record if isinstance(record[k], dict) and "loss" in record[k])
        la, lb = np.array(record[a]["loss"]), np.array(record[b]["loss"])
        start, n = int(record.get("start_step", 0)), int(record["updates"])
        end = max(record["params_rel_l2_diff"], key=int)
        print(
            f"| {path.stem.removeprefix('trajectory_sraven_')} | {start + 1:,}-{start + n:,} | {a} vs {b} |"
            f" {float(np.max(np.abs(la - lb) / np.abs(lb))):.1e} | {record['params_rel_l2_diff'][end]:.1e} |"
            f" {record['first_update_parted'] or 'none'} |"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=("ours", "theirs", "compare", "summary"))
    ap.add_argument("--out", type=Path, help="folder for the .npz files (all steps but summary)")
    ap.add_argument("--variant", choices=sorted(MIXERS), default="hyla", help="ours: attention variant")
    ap.add_argument("--seed", type=int, default=0, help="ours: initial weights and batches")
    ap.add_argument("--steps", type=int, default=1500, help="ours: updates to make")
    ap.add_argument("--float64", action="store_true", help="ours: both codes compute in float64")
    ap.add_argument("--dropout", action="store_true", help="ours: attention dropout on, theirs given our masks")
    ap.add_argument("--backend", default="auto", help="ours: model.attention_backend (a control: direct)")
    ap.add_argument("--set", action="append", default=[], help="ours: a config override KEY=VALUE (tests: tiny)")
    ap.add_argument(
        "--start",
        type=Path,
        help="ours: a checkpoint of a SRAVEN run (its step-* folder): both codes start from its weights, AdamW"
        " state and step, on the run's own next batches, with the run's config (--variant, --seed unused)",
    )
    ap.add_argument(
        "--name", help="the trajectory's name (default: the step's); ours not 'ours': a control on the batches of ours"
    )
    ap.add_argument("--float64-schedule", action="store_true", help="theirs: their learning rates in float64")
    ap.add_argument("--a", default="ours", help="compare: this trajectory ...")
    ap.add_argument("--b", default="theirs", help="compare: ... against this one")
    ap.add_argument("--part", type=float, default=1e-6, help="compare: relative loss difference that counts as parted")
    ap.add_argument("--json", type=Path, help="compare: also write the comparison here")
    ap.add_argument("records", nargs="*", type=Path, help="summary: the JSON records of compare --json")
    args = ap.parse_args()
    args.name = args.name or args.step
    if args.step != "summary" and args.out is None:
        ap.error(f"{args.step} needs --out (the folder of the .npz files)")
    return {"ours": ours, "theirs": theirs, "compare": compare, "summary": summary}[args.step](args) or 0


if __name__ == "__main__":
    sys.exit(main())
