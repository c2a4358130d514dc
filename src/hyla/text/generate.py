"""``hyla generate RUN_DIR --prompt TEXT``: sample a continuation from a trained language model."""

from __future__ import annotations

import argparse
import sys


def run(args: argparse.Namespace) -> int:
    from hyla.models.lm import generate
    from hyla.tasks import task_entry
    from hyla.train.run.folder import load_trained

    try:
        _path, cfg, task, model, _weights, _step = load_trained(args.run)
    except ValueError as err:
        print(f"hyla generate: error: {err}", file=sys.stderr)
        return 2
    if not task_entry(cfg.data.task).generates_text:
        print(f"hyla generate: error: {args.run} is a {cfg.data.task} run, not a language model", file=sys.stderr)
        return 2
    ids = task.encode(args.prompt)  # type: ignore[attr-defined]
    if not ids:
        print("hyla generate: error: --prompt must not be empty", file=sys.stderr)
        return 2
    new = generate(
        model,
        ids,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        eos_id=task.eos_id,
        seed=args.seed,
    )  # type: ignore[attr-defined]
    print(args.prompt + task.decode(new))  # type: ignore[attr-defined]
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="sample text from a trained language-model run")
    p.add_argument("run", metavar="RUN_DIR")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)
