"""Our SRAVEN model and the authors' (smonsays/hypernetwork-attention) on the same weights and problems.

The curves of our SRAVEN paper runs can only be trusted to stand for the paper's setup if the two codes
compute the same function and the same gradients. This script checks that without training either:
it copies one set of our weights (a run's trained model, or a fresh init) into the authors' flax model
and compares, on the same batch of problems, in eval mode (no dropout):

- the logits at the four answer tokens, the loss and the accuracy (all four features right);
- the gradient of the loss for every parameter.

Three steps, because their code needs its own environment (JAX, flax; never a dependency of ours):

    .venv/bin/python lab/authors/authors_equivalence.py ours --run RUN_DIR --out /tmp/eq   # or --init VARIANT
    XLA_FLAGS=--xla_disable_hlo_passes=onednn-matmul-rewriter PYTHONPATH=$AUTHORS_CODE \\
        $AUTHORS_VENV/bin/python lab/authors/authors_equivalence.py theirs --out /tmp/eq
    .venv/bin/python lab/authors/authors_equivalence.py compare --out /tmp/eq

``import-run --their-init FILE.npz --seed S --out RUN_DIR`` turns their trained params (``authors_sraven_resumable.py
--dump_trained``) into a run directory of ours (the paper config at seed S with their held-out tasks, and the weights),
which ``hyla analyze`` reads (``lab/authors/their_sraven_models.sh``).

``import-init --their-init FILE.npz --out W.safetensors`` turns their initial draw (written by
``authors_sraven_resumable.py --dump_init``) into our weights, for ``hyla train sraven train.init_weights=W``: our
training from their initial weights, on our data and dropout streams (#38, part 3's swap of the initial draw).

``ours`` writes ``ours.npz`` (weights in their layout, problems, logits, loss, gradients); ``theirs``
reads it and writes ``theirs.npz``; ``compare`` prints the largest relative difference of each and exits
non-zero above ``--rtol`` (default :data:`RTOL` of the precision; ``--float64`` makes both codes compute in
float64, which shows whether they compute the same function exactly rather than within float32 noise).
Only numpy is imported outside the ``ours`` and ``theirs`` steps.

Variants: ``hyla`` (their ``linear_hypatt``), ``softmax`` (``softmax_attention``), ``linear``
(``linear_attention``). Their flax layout: Dense kernels are (in, out), the q/k/v projections
(in, heads, head dim), the output projection (heads, head dim, out).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # ours only: the ``theirs`` step runs in the authors' venv, where our package is absent
    from hyla.models import Transformer
    from hyla.tasks.base import Task
    from hyla.train.config import ExperimentConfig

#: our attention preset -> their sequence_mixer
MIXERS = {"hyla": "linear_hypatt", "softmax": "softmax_attention", "linear": "linear_attention"}


Reshape = Callable[[np.ndarray], np.ndarray]


def _same(w: np.ndarray) -> np.ndarray:
    return w


def _transposed(w: np.ndarray) -> np.ndarray:
    return w.T


def layout_pairs(num_layers: int, num_heads: int) -> list[tuple[str, str, Reshape, Reshape]]:
    """(our state-dict name, their flat ``a/b/c`` name, ours -> theirs, theirs -> ours) for every parameter."""

    def heads_in(w_OxI: np.ndarray) -> np.ndarray:  # (H*d, in) -> (in, H, d)
        return w_OxI.T.reshape(w_OxI.shape[1], num_heads, -1)

    def heads_in_back(w_IxHxD: np.ndarray) -> np.ndarray:  # (in, H, d) -> (H*d, in)
        return w_IxHxD.reshape(w_IxHxD.shape[0], -1).T

    def heads_bias(b_O: np.ndarray) -> np.ndarray:  # (H*d,) -> (H, d)
        return b_O.reshape(num_heads, -1)

    def flat(b_HxD: np.ndarray) -> np.ndarray:
        return b_HxD.reshape(-1)

    def heads_out(w_OxI: np.ndarray) -> np.ndarray:  # (out, H*d) -> (H, d, out)
        return w_OxI.T.reshape(num_heads, -1, w_OxI.shape[0])

    def heads_out_back(w_HxDxO: np.ndarray) -> np.ndarray:  # (H, d, out) -> (out, H*d)
        return w_HxDxO.reshape(-1, w_HxDxO.shape[-1]).T

    pairs = [
        ("embed.weight", "embedding/kernel", _transposed, _transposed),
        ("embed.bias", "embedding/bias", _same, _same),
        ("norm.weight", "decoder_norm/scale", _same, _same),
        ("norm.bias", "decoder_norm/bias", _same, _same),
        ("readout.weight", "logitdense/kernel", _transposed, _transposed),
        ("readout.bias", "logitdense/bias", _same, _same),
    ]
    for i in range(num_layers):
        ours, theirs = f"blocks.{i}.", f"transformer_block_{i}/"
        for n in (1, 2):
            pairs.append((f"{ours}norm{n}.weight", f"{theirs}norm{n}/scale", _same, _same))
            pairs.append((f"{ours}norm{n}.bias", f"{theirs}norm{n}/bias", _same, _same))
        rel = (f"{ours}attn.relative_position.embedding_HxN", f"{theirs}relative_embedding/rel_embedding")
        pairs.append((*rel, _same, _same))
        for name, proj in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            mixer = f"{theirs}sequence_mixer/{name}"
            pairs.append((f"{ours}attn.{proj}.weight", f"{mixer}/kernel", heads_in, heads_in_back))
            pairs.append((f"{ours}attn.{proj}.bias", f"{mixer}/bias", heads_bias, flat))
        pairs.append((f"{ours}attn.out_proj.weight", f"{theirs}sequence_mixer/out/kernel", heads_out, heads_out_back))
        pairs.append((f"{ours}attn.out_proj.bias", f"{theirs}sequence_mixer/out/bias", _same, _same))
        for n, fc in ((0, "fc1"), (1, "fc2")):
            dense = f"{theirs}state_mixer/Dense_{n}"
            pairs.append((f"{ours}ff.{fc}.weight", f"{dense}/kernel", _transposed, _transposed))
            pairs.append((f"{ours}ff.{fc}.bias", f"{dense}/bias", _same, _same))
    return pairs


def to_their_layout(state: dict[str, np.ndarray], num_layers: int, num_heads: int) -> dict[str, np.ndarray]:
    """Our state dict (torch names, Linear weights (out, in)) as flat ``a/b/c`` paths of their params."""
    return {theirs: to_theirs(state[ours]) for ours, theirs, to_theirs, _ in layout_pairs(num_layers, num_heads)}


def from_their_layout(params: dict[str, np.ndarray], num_layers: int, num_heads: int) -> dict[str, np.ndarray]:
    """The inverse of :func:`to_their_layout`: their flat ``a/b/c`` params as our state dict's learned weights."""
    pairs = layout_pairs(num_layers, num_heads)
    return {ours: np.ascontiguousarray(to_ours(params[theirs])) for ours, theirs, _, to_ours in pairs}


def their_weights(their_params: Path, variant: str, overrides: list[str] | None = None) -> tuple[Any, Any]:
    """(our SRAVEN config with ``overrides``, our model holding their params): ``their_params`` is an .npz of
    ``authors_sraven_resumable.py --dump_init`` or ``--dump_trained``."""
    import torch

    from hyla.train.build import build_model, build_task
    from hyla.train.config import load_config

    cfg = load_config("sraven", [f"model.attention={variant}", *(overrides or [])])
    model = build_model(cfg, build_task(cfg, None))
    with np.load(their_params) as f:
        params = {k: f[k] for k in f.files}
    if str(params.pop("__mixer__", MIXERS[variant])) != MIXERS[variant]:
        raise ValueError(f"{their_params} holds another attention than {MIXERS[variant]} (--variant)")
    pairs = layout_pairs(cfg.model.num_layers, cfg.model.num_heads)
    unmapped = sorted(set(params) - {theirs for _, theirs, _, _ in pairs})
    if unmapped:
        raise ValueError(f"{their_params} has parameters we do not map: {unmapped[:5]}")
    try:
        weights = from_their_layout(params, cfg.model.num_layers, cfg.model.num_heads)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    except KeyError as err:
        raise ValueError(f"{their_params} lacks their parameter {err} (another model size?)") from err
    except RuntimeError as err:  # load_state_dict names the missing, unexpected and mis-shaped keys
        raise ValueError(f"{their_params} does not fit our {variant} SRAVEN model: {err}") from err
    return cfg, model


def _norm(model: Any) -> float:
    import torch

    return torch.cat([p.detach().double().flatten() for p in model.parameters()]).norm().item()


def import_init(args: argparse.Namespace) -> None:
    """Their initial draw (``authors_sraven_resumable.py --dump_init``) as our weights for ``train.init_weights``."""
    from hyla.train.run.checkpoint import save_weights

    _, model = their_weights(args.their_init, args.variant)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_weights(args.out, model.state_dict())
    print(f"wrote {args.out} from {args.their_init}, parameter norm {_norm(model):.4f}")


def import_run(args: argparse.Namespace) -> None:
    """Their trained params (``--dump_trained``) as a run directory of ours that ``hyla analyze`` reads:
    ``config.yaml`` (the paper config at their seed ``--seed``, with their held-out tasks:
    ``data.heldout_draw=authors``) and the final weights."""
    from hyla.train.config import dump_config
    from hyla.train.run.checkpoint import save_weights
    from hyla.train.run.folder import FINAL_WEIGHTS

    cfg, model = their_weights(args.their_init, args.variant, [f"seed={args.seed}", "data.heldout_draw=authors"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.yaml").write_text(dump_config(cfg))
    save_weights(args.out / FINAL_WEIGHTS, model.state_dict())
    print(f"wrote {args.out}: their seed-{args.seed} split, parameter norm {_norm(model):.4f}")


def ours(args: argparse.Namespace) -> None:
    import torch

    from hyla.train.build import build_model, build_task
    from hyla.train.config import load_config
    from hyla.train.run.folder import load_trained, read_run

    torch.set_num_threads(1)
    evaluated: dict[str, float] = {}
    if args.run is not None:
        trained = load_trained(args.run)
        cfg, task, model, weights = trained.config, trained.task, trained.model, f"{args.run} ({trained.weights})"
        evaluated = {
            f"run_acc/{r['split']}": r["acc"]
            for r in read_run(args.run).metrics
            if r["step"] == trained.step and "acc" in r
        }
    else:
        cfg = load_config("sraven", [f"model.attention={args.init}", f"seed={args.seed}"])
        task = build_task(cfg, None)
        model, weights = build_model(cfg, task).eval(), f"fresh init ({args.init}, seed {args.seed})"
    if cfg.data.task != "sraven" or cfg.model.attention not in MIXERS:
        raise ValueError(f"a SRAVEN run of {', '.join(MIXERS)} is compared, not {cfg.data.task} {cfg.model.attention}")
    batch = task.sample(args.num, args.split, torch.Generator().manual_seed(args.seed))
    inputs = batch.inputs
    if args.float64:
        model, inputs = model.double(), inputs.double()
    model.zero_grad()
    outputs = model(inputs)
    loss = task.loss(outputs, batch)
    loss.backward()
    logits = outputs[:, -cfg.data.num_features :].detach().numpy()
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}  # training changes them
    grads = {k: p.grad.numpy().copy() for k, p in model.named_parameters()}
    layout = {"num_layers": cfg.model.num_layers, "num_heads": cfg.model.num_heads}
    arrays = {f"param/{k}": v for k, v in to_their_layout(state, **layout).items()}
    arrays |= {f"grad/{k}": v for k, v in to_their_layout(grads, **layout).items()}
    if args.train_steps:
        start = 0 if args.run is None else trained.step
        arrays |= our_updates(model, task, cfg, start, args.train_steps, args.seed, layout)
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(
        args.out / "ours.npz",
        x=inputs.numpy(),
        y=batch.targets.numpy(),
        logits=logits,
        loss=np.float64(loss.item()),
        acc=np.float64((logits.argmax(-1) == batch.targets.numpy()).all(1).mean()),
        mixer=np.array(MIXERS[cfg.model.attention]),
        weights=np.array(weights),
        split=np.array(args.split),
        tasks=np.array([len(task.task_ids["test"]), len(task.task_ids["ood"])]),
        **{k: np.float64(v) for k, v in evaluated.items()},
        **arrays,
    )
    print(f"wrote {args.out / 'ours.npz'}: {weights}, {args.num} {args.split} problems, loss {loss.item():.6f}")


def our_updates(
    model: Transformer, task: Task, cfg: ExperimentConfig, start: int, steps: int, seed: int, layout: dict[str, int]
) -> dict[str, np.ndarray]:
    """``steps`` of our training updates from schedule step ``start`` (fresh AdamW moments, as after
    :func:`~hyla.train.engines.optim.build_optimizer`), in eval mode (attention dropout off: the one random part
    of a step, whose draws cannot match across libraries), on ``train`` batches of the run's batch size.
    Returns the batches, the learning rate of every step of the schedule and the parameters after."""
    import torch

    from hyla.train.engines.optim import build_optimizer, lr_at

    dtype = next(model.parameters()).dtype
    lrs = np.array([lr_at(s, cfg) for s in range(cfg.train.steps + 1)])
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed + 1)
    xs, ys = [], []
    for i in range(steps):  # as LoneEngine.train_step makes an update
        for group in optimizer.param_groups:
            group["lr"] = lrs[start + i]
        batch = task.sample(cfg.train.batch_size, "train", gen)
        x = batch.inputs.to(dtype)
        optimizer.zero_grad(set_to_none=True)
        outputs = model(x, last_positions=task.num_output_positions)
        task.loss(outputs, batch).backward()
        optimizer.step()
        xs.append(x.numpy())
        ys.append(batch.targets.numpy())
    after = to_their_layout({k: v.detach().numpy() for k, v in model.state_dict().items()}, **layout)
    schedule = {"warmup": cfg.train.warmup_steps, "steps": cfg.train.steps, "lr": cfg.train.lr}
    return {
        "train_x": np.stack(xs),
        "train_y": np.stack(ys),
        "train_start": np.int64(start),
        "lrs": lrs,
        **{f"schedule/{k}": np.float64(v) for k, v in schedule.items()},
        "weight_decay": np.float64(cfg.train.weight_decay),
        **{f"updated/{k}": v for k, v in after.items()},
    }


def their_updates(
    model: Any, loss_fn: Callable[..., Any], params: dict[str, Any], data: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Their optimizer as their run.py builds it (optax.adamw, weight decay masked to ``ndim != 1``,
    ``warmup_cosine_decay_schedule(0, lr, warmup, steps - warmup, 0.1 lr)``) on our batches. The updates
    read our learning rates (so that a trained model can start mid-schedule); their schedule itself is
    returned at every step, to compare with ours."""
    import jax
    import jax.numpy as jnp
    import optax

    warmup, steps = (int(data[f"schedule/{k}"]) for k in ("warmup", "steps"))
    peak = float(data["schedule/lr"])
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=warmup, decay_steps=steps - warmup, end_value=peak * 0.1
    )
    their_lrs = np.asarray(jax.vmap(schedule)(jnp.arange(steps + 1)))
    lrs, start = jnp.asarray(data["lrs"]), int(data["train_start"])
    optimizer = optax.adamw(
        learning_rate=lambda count: lrs[start + count],
        weight_decay=float(data["weight_decay"]),
        mask=lambda p: jax.tree_util.tree_map(lambda x: x.ndim != 1, p),
    )
    state = optimizer.init(params)
    grad_fn = jax.grad(lambda p, x, y: loss_fn(p, x, y)[0])
    for x, y in zip(data["train_x"], data["train_y"]):
        grads = grad_fn(params, jnp.asarray(x), jnp.asarray(y))
        updates, state = optimizer.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return {"their_lrs": their_lrs, "params": params}


def their_model(mixer: str, float64: bool) -> tuple[Any, Any]:
    """Their SRAVEN model of ``mixer`` and config (``configs/raven.py``), computing in float64 if asked; in
    their venv with ``PYTHONPATH=$AUTHORS_CODE``."""
    import jax
    import jax.numpy as jnp
    from configs.raven import get_config

    from hyla.models import transformer as transformer_module
    from hyla.models.transformer import CausalTransformer, TransformerConfig

    jax.config.update("jax_default_matmul_precision", "highest")
    if float64:
        jax.config.update("jax_enable_x64", True)
        # Their position bias is computed in its ``dtype`` attribute, float32 by default, whatever the
        # parameters' precision; in float64 it is set to float64 too, so that the whole model is.
        transformer_module.RelativePositionBiases = partial(
            transformer_module.RelativePositionBiases, dtype=jnp.float64
        )
    cfg = get_config(f"raven_3x3_4features;{mixer}")
    return CausalTransformer(TransformerConfig(**cfg.model)), cfg


def theirs(args: argparse.Namespace) -> None:
    import jax
    import jax.numpy as jnp
    import optax
    from flax.traverse_util import flatten_dict, unflatten_dict

    # their package, also named hyla (PYTHONPATH=$AUTHORS_CODE; ours is not importable in their venv)
    from hyla.data.raven import create_raven_datasets

    with np.load(args.out / "ours.npz") as z:
        data = dict(z)
    model, cfg = their_model(str(data["mixer"]), float64=data["x"].dtype == np.float64)
    x, y = jnp.asarray(data["x"]), jnp.asarray(data["y"])
    init = flatten_dict(model.init(jax.random.PRNGKey(0), x[:1], deterministic=True)["params"], sep="/")
    given = {k[len("param/") :]: v for k, v in data.items() if k.startswith("param/")}
    if set(given) != set(init):
        raise SystemExit(
            f"parameter names differ: ours only {set(given) - set(init)}, theirs only {set(init) - set(given)}"
        )
    for k, v in init.items():
        if v.shape != given[k].shape:
            raise SystemExit(f"{k}: our shape {given[k].shape}, theirs {v.shape}")
    params = unflatten_dict({k: jnp.asarray(v) for k, v in given.items()}, sep="/")
    num_features = cfg.data.num_features

    def loss_fn(p, x, y):  # their SymbolicRavenLoss, eval mode
        logits = model.apply({"params": p}, x, deterministic=True)[:, -num_features:]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
    logits = np.asarray(logits)
    # The same weights on problems from their generator and loaders (their split of seed 0: other task sets
    # than ours, so only the mix over all 330 tasks is comparable with our run's evaluation).
    their_acc = {}
    if args.their_problems:
        batch = 512
        num = -(-args.their_problems // batch) * batch
        d = cfg.data
        options = dict(num_features=d.num_features, feature_maxval=d.feature_maxval, grid_size=d.grid_size)
        _, loaders, _ = create_raven_datasets(
            batch,
            d.seq_len,
            batch,
            num,
            num,
            **options,
            permute_features=d.permute_features,
            frac_ood=d.frac_ood,
            seed=0,
        )[0]
        apply = jax.jit(lambda p, x: model.apply({"params": p}, x, deterministic=True)[:, -num_features:])
        for split, loader in loaders.items():
            right = [np.asarray((apply(params, b.x).argmax(-1) == b.y).all(1)) for b in loader]
            their_acc[f"their_problems_acc/{split}"] = np.float64(np.concatenate(right).mean())
        their_acc["their_problems_num"] = np.int64(num)
    updated = {}
    if "train_x" in data:
        result = their_updates(model, loss_fn, params, data)
        updated = {"their_lrs": result["their_lrs"]}
        updated |= {f"updated/{k}": np.asarray(v) for k, v in flatten_dict(result["params"], sep="/").items()}
    np.savez(
        args.out / "theirs.npz",
        **their_acc,
        **updated,
        logits=logits,
        loss=np.float64(loss),
        acc=np.float64((logits.argmax(-1) == data["y"]).all(1).mean()),
        **{f"grad/{k}": np.asarray(v) for k, v in flatten_dict(grads, sep="/").items()},
    )
    print(f"wrote {args.out / 'theirs.npz'}: their {data['mixer']}, loss {float(loss):.6f}")


#: largest relative difference allowed, by the precision both computed in. float32: two libraries summing in
#: different orders; the all-zero answer tokens reach the first LayerNorm as a (near) zero vector, whose
#: gradient 1/sqrt(eps) = 1e3 amplifies that rounding (measured at init: 2e-4, HYLA), and Adam's first
#: updates divide gradients near zero by their own size. float64 leaves room for the same amplifications.
RTOL = {"float64": 1e-9, "float32": 1e-3}
#: a parameter whose gradient is below this fraction of the median parameter's counts as zero
ZERO_GRADIENT = 1e-6


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """Largest difference relative to the reference's largest magnitude (robust to entries near zero)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def compare(args: argparse.Namespace) -> int:
    with np.load(args.out / "ours.npz") as z, np.load(args.out / "theirs.npz") as t:
        a, b = dict(z), dict(t)
    rows = [("logits (answer tokens)", rel(a["logits"], b["logits"])), ("loss", rel(a["loss"], b["loss"]))]
    grads = {k[len("grad/") :]: (a[k], b[k]) for k in sorted(a) if k.startswith("grad/")}
    # A gradient that is zero in exact arithmetic (softmax's key bias: a constant per query) is rounding
    # noise in both codes; it is compared to a typical parameter's gradient instead of to itself. Typical
    # is the median: at init the embedding bias alone gets a gradient ~1e4 times larger (the answer tokens
    # are all zero, so they embed to the bias, 0 at init, and the first LayerNorm divides by sqrt(eps)).
    scale = float(np.median([np.abs(theirs_g).max() for _, theirs_g in grads.values()]))
    zero = {k for k, (_, g) in grads.items() if np.abs(g).max() < ZERO_GRADIENT * scale}
    grad_rel = {k: rel(*grads[k]) for k in grads if k not in zero}
    worst = max(grad_rel, key=grad_rel.__getitem__)
    rows.append((f"gradients, worst of {len(grad_rel)} ({worst})", grad_rel[worst]))
    if zero:
        noise = max(float(np.abs(np.asarray(o, np.float64) - t).max()) / scale for o, t in (grads[k] for k in zero))
        rows.append((f"gradients zero in exact arithmetic ({', '.join(sorted(zero))}), / median gradient", noise))
    if "train_x" in a:
        rows.append(("learning rate, every step of the schedule", rel(a["lrs"], b["their_lrs"])))
        delta = {}
        for k in sorted(a):  # zero-gradient parameters: Adam turns their rounding noise into +-lr steps
            if k.startswith("updated/") and k[len("updated/") :] not in zero:
                before = np.asarray(a[f"param/{k[len('updated/') :]}"], np.float64)
                delta[k[len("updated/") :]] = rel(a[k] - before, b[k] - before)
        worst = max(delta, key=delta.__getitem__)
        steps = f"{len(a['train_x'])} updates from step {int(a['train_start'])}"
        rows.append((f"parameter change after {steps}, worst of {len(delta)} ({worst})", delta[worst]))
    print(f"{a['weights']}; {len(a['y'])} {a['split']} problems; their {a['mixer']}\n")
    if zero and "train_x" in a:
        print("parameter change not compared for the zero-gradient parameters: Adam divides their rounding")
        print("noise by its own size, so in both codes they move by about +-lr per update, in random directions\n")
    print("| quantity | max abs diff / max abs (theirs) |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value:.1e} |")
    print(f"\nloss: ours {float(a['loss']):.6f}, theirs {float(b['loss']):.6f}")
    print(f"accuracy (all four features): ours {100 * float(a['acc']):.2f}%, theirs {100 * float(b['acc']):.2f}%")
    if "their_problems_num" in b and "run_acc/test" in a:
        w_test, w_ood = (int(n) for n in a["tasks"])

        def over_all_tasks(acc_test: float, acc_ood: float) -> float:  # both sample tasks uniformly
            return 100 * (w_test * acc_test + w_ood * acc_ood) / (w_test + w_ood)

        ours_all = over_all_tasks(float(a["run_acc/test"]), float(a["run_acc/ood"]))
        theirs_all = over_all_tasks(float(b["their_problems_acc/test"]), float(b["their_problems_acc/ood"]))
        n = int(b["their_problems_num"])
        print(
            f"\nthe same weights over all {w_test + w_ood} tasks ({w_test} training, {w_ood} held out, each split's"
            f" accuracy weighted by its tasks): our run's evaluation {ours_all:.2f}% (51,200 problems per split);"
            f" their generator {theirs_all:.2f}% ({n} problems per split of their seed-0 split)"
        )
    rtol = args.rtol if args.rtol is not None else RTOL[str(a["x"].dtype)]
    bad = [name for name, value in rows if value > rtol]
    if bad:
        print(f"\nabove rtol {rtol:.0e}: {', '.join(bad)}")
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=("ours", "theirs", "compare", "import-init", "import-run"))
    ap.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for ours.npz and theirs.npz (import-init: a file; import-run: a run directory)",
    )
    ap.add_argument(
        "--their-init", type=Path, help="import-init / import-run: their params (.npz of --dump_init / --dump_trained)"
    )
    ap.add_argument("--variant", choices=sorted(MIXERS), default="hyla", help="import-init: our attention preset")
    ap.add_argument("--run", type=Path, help="ours: a SRAVEN run directory (its final weights or latest checkpoint)")
    ap.add_argument("--init", choices=sorted(MIXERS), help="ours: a fresh SRAVEN model of this variant instead")
    ap.add_argument("--split", default="ood", help="ours: the problems' split (default ood)")
    ap.add_argument("--num", type=int, default=256, help="ours: problems in the batch (default 256)")
    ap.add_argument("--seed", type=int, default=0, help="ours: problem (and --init) seed; import-run: their seed")
    ap.add_argument(
        "--their-problems",
        type=int,
        default=4096,
        help="theirs: also evaluate on this many problems per split of theirs",
    )
    ap.add_argument("--train-steps", type=int, default=0, help="ours: also compare this many training updates")
    ap.add_argument("--float64", action="store_true", help="ours: both codes compute in float64 (exactness)")
    ap.add_argument("--rtol", type=float, help="compare: largest relative difference allowed (default: RTOL)")
    args = ap.parse_args()
    if args.step == "ours":
        if (args.run is None) == (args.init is None):
            ap.error("ours: give exactly one of --run RUN_DIR and --init VARIANT")
        ours(args)
    elif args.step == "theirs":
        theirs(args)
    elif args.step in ("import-init", "import-run"):
        if args.their_init is None:
            ap.error(f"{args.step}: give --their-init FILE.npz")
        (import_init if args.step == "import-init" else import_run)(args)
    else:
        return compare(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
