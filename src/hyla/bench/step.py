"""``hyla bench step``: time one full training step (forward, backward, AdamW) per attention variant.

Random inputs of the task's shapes; like training, the model computes only the output positions
that the task's loss reads (``last_positions``).

Each variant runs in its own subprocess so that peak memory is per variant: on CUDA it is
``torch.cuda.max_memory_allocated``; on CPU the subprocess's peak resident set size (which includes
the ~0.3 GB of the PyTorch runtime itself).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from hyla.attention.config import BACKENDS, canonical_backend
from hyla.bench import device_label, require_device, require_writable
from hyla.cpu import blas_path
from hyla.models import Transformer, TransformerConfig, num_parameters
from hyla.models.transformer import GELU_APPROXIMATIONS
from hyla.tasks import REGISTRY, task_entry
from hyla.train.engines.fast import keep_compiled_code_apart
from hyla.train.engines.optim import FUSED_ADAMW_DEVICES

#: the sizes of the paper's model (notes section 2) read from the task's config in ``hyla/configs/``; seq_len
#: and input/output sizes come from the task encoding, the rest of the model is the variant's
PAPER_MODEL_SIZES = ("num_layers", "emb_dim", "num_heads", "qk_dim", "v_dim", "mlp_dim")


def paper_tasks() -> tuple[str, ...]:
    """The tasks with a paper model that ``make_task`` builds."""
    return tuple(name for name, entry in REGISTRY.items() if entry.paper_config and entry.standalone)


def paper_model(task: str) -> dict[str, int]:
    """The model sizes of the task's paper config (``hyla.tasks.entry.TaskEntry.paper_config``)."""
    from hyla.train.config import read_config_values

    model = read_config_values(str(task_entry(task).paper_config))["model"]
    return {k: model[k] for k in PAPER_MODEL_SIZES}


def _task_shapes(task: str) -> tuple[int, int, int, int | None]:
    """(seq_len, input_dim, output_dim, positions the loss reads) from the task generator."""
    from hyla.tasks import make_task

    t = make_task(task)
    return t.seq_len, t.input_dim, t.output_dim, t.num_output_positions


def time_variant(
    task: str,
    variant: str,
    batch_size: int,
    steps: int,
    warmup: int,
    device: str,
    compile_model: bool = False,
    all_positions: bool = False,
    backend: str = "auto",
    dropout: float = 0.0,
    gelu_approximate: str = "none",
) -> dict[str, float]:
    seq_len, input_dim, output_dim, last_positions = _task_shapes(task)
    if all_positions:  # the model computes every position, as without Transformer(last_positions=...)
        last_positions = None
    torch.manual_seed(0)
    cfg = TransformerConfig(
        input_dim=input_dim,
        output_dim=output_dim,
        attention=variant,
        relative_position_buckets=seq_len,
        relative_position_max_distance=seq_len,
        attention_backend=backend,
        attention_dropout=dropout,
        gelu_approximate=gelu_approximate,
        **paper_model(task),
    )
    model = Transformer(cfg).to(device)
    fused = torch.device(device).type in FUSED_ADAMW_DEVICES  # as training's AdamW (hyla.train.engines.optim)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=fused)
    if compile_model:
        keep_compiled_code_apart()
    step_fn = torch.compile(model) if compile_model else model
    x = torch.randn(batch_size, seq_len, input_dim, device=device)
    y = torch.randint(0, output_dim, (batch_size, last_positions or seq_len), device=device)

    def step() -> None:  # as in training: the model computes only the positions the loss reads
        opt.zero_grad(set_to_none=True)
        out = step_fn(x, last_positions=last_positions)
        torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten()).backward()
        opt.step()

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    ms = 1000 * statistics.median(times)
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "ms_per_step": ms,
        "tokens_per_s": batch_size * seq_len / (ms / 1000),
        "peak_mem_mb": peak,
        "params": float(num_parameters(model)),
    }


def run(args: argparse.Namespace) -> int:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    from hyla.attention import PRESETS

    unknown = [v for v in variants if v not in PRESETS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; allowed values: {', '.join(PRESETS)}")
    if args.task not in paper_tasks():
        raise SystemExit(f"--task must be one of {', '.join(paper_tasks())}, got {args.task!r}")
    try:  # a former name (reference, explicit) is recorded under the name that replaced it
        args.backend = canonical_backend(args.backend)
    except ValueError:
        raise SystemExit(f"--backend must be one of {', '.join(BACKENDS)}, got {args.backend!r}") from None
    if not 0 <= args.dropout < 1:
        raise SystemExit(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.gelu not in GELU_APPROXIMATIONS:
        raise SystemExit(f"--gelu must be one of {', '.join(GELU_APPROXIMATIONS)}, got {args.gelu!r}")
    if args.steps < 1 or args.batch_size < 1 or args.warmup < 0:
        raise SystemExit(
            f"--steps and --batch-size must be >= 1, --warmup >= 0; got {args.steps}, {args.batch_size}, {args.warmup}"
        )
    require_device(args.device)
    require_writable("--json", args.json)
    results: dict[str, dict[str, float]] = {}
    for v in variants:
        cmd = [
            sys.executable,
            "-c",
            "import json,sys; from hyla.runtime import tune_cpu_allocator; tune_cpu_allocator(); "
            "from hyla.bench.step import time_variant; "
            f"print(json.dumps(time_variant({args.task!r}, {v!r}, {args.batch_size}, {args.steps}, "
            f"{args.warmup}, {args.device!r}, {args.compile}, {args.all_positions}, {args.backend!r}, "
            f"{args.dropout!r}, {args.gelu!r})))",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:  # its last line says why (the traceback above it is the measuring process's)
            raise SystemExit(f"{v}: the measuring process failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        results[v] = json.loads(proc.stdout.strip().splitlines()[-1])
    device_name = device_label(args.device)
    base = results.get("softmax", {}).get("ms_per_step")
    blas = blas_path()
    print(
        f"task={args.task} batch={args.batch_size} device={device_name} torch={torch.__version__} "
        f"blas={blas} backend={args.backend} dropout={args.dropout} gelu={args.gelu}"
    )
    print(f"{'variant':34s} {'ms/step':>9s} {'tokens/s':>10s} {'peak MB':>9s} {'params':>9s} {'vs softmax':>10s}")
    for v, r in results.items():
        ratio = f"{r['ms_per_step'] / base:.2f}x" if base else "-"
        print(
            f"{v:34s} {r['ms_per_step']:9.1f} {r['tokens_per_s']:10.0f} {r['peak_mem_mb']:9.0f} "
            f"{int(r['params']):9d} {ratio:>10s}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "variants": results,
                    "device": device_name,
                    "task": args.task,
                    "batch_size": args.batch_size,
                    "torch": torch.__version__,
                    "blas": blas,
                    "steps": args.steps,
                    "backend": args.backend,
                    "dropout": args.dropout,
                    "gelu": args.gelu,
                },
                f,
                indent=2,
            )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("step", help="time a full training step per attention variant")
    p.add_argument("--task", default="sraven", help="sraven | fuzzy_logic (the paper's model for that task)")
    p.add_argument("--variants", default="softmax,linear,hyla", help="comma-separated attention presets")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=20, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument(
        "--backend",
        default="auto",
        help="how attention is computed (docs/backends.md): " + " | ".join(BACKENDS),
    )
    p.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="attention dropout on the latent code while training (the paper configs: 0.1)",
    )
    p.add_argument(
        "--gelu",
        default="none",
        help="the MLP's GELU: none (erf, torch's default) | tanh (the paper configs', flax's nn.gelu)",
    )
    p.add_argument(
        "--all-positions",
        action="store_true",
        help="compute every output position (not only those the loss reads), for comparison",
    )
    p.add_argument("--json", help="write {'variants': {name: {'ms_per_step', 'peak_mem_mb', ...}}, 'device'}")
    p.set_defaults(func=run)
