"""The ``hyla`` command line. Each subcommand lives beside the code it drives and registers itself."""

from __future__ import annotations

import argparse
import importlib
import sys

from hyla import cpu
from hyla.runtime import tune_cpu_allocator
from hyla.textio import print_warnings_on_one_line

#: subcommand -> (module providing ``register(subparsers)``, its line in ``hyla --help``); a module is imported
#: only for its own command, so ``hyla --help`` imports neither torch nor matplotlib
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("hyla.demo", "HYLA beside softmax: the paper's trained models re-scored, and a short run (CPU)"),
    "train": ("hyla.train.cli", "train a model on a task (packaged configs: hyla/configs/)"),
    "sweep": ("hyla.sweep.cli", "run a sweep file (packaged ones by name): resumable, recorded under ./results/sweeps"),
    "data": ("hyla.export", "export task problems as .npz"),
    "bench": ("hyla.bench", "speed and memory benchmarks"),
    "analyze": ("hyla.analysis.cli", "latent-code analysis of trained runs"),
    "report": ("hyla.analysis.report", "tables (mean +- s.e. over seeds) and plots over run directories"),
    "generate": ("hyla.text.generate", "sample text from a trained language-model run"),
}


#: an optional dependency -> the extra that installs it (``pip install "hyla[EXTRA]"``)
EXTRAS: dict[str, str] = {
    "matplotlib": "analysis",
    "sklearn": "analysis",
    "scipy": "analysis",
    "tensorboard": "tensorboard",
    "triton": "kernels",
    "tokenizers": "text",
    "sentencepiece": "text",
    "datasets": "text",
    "submitit": "sweep",
}


def missing_extra(err: ModuleNotFoundError) -> str | None:
    """The one line for a command that needs an optional dependency this install lacks, else None."""
    name = (err.name or "").split(".")[0]
    if name not in EXTRAS:
        return None
    return f"this command needs {name}, which this install lacks: pip install 'hyla[{EXTRAS[name]}]'"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with ``only``'s subcommand registered by its module (every other one a line of help), or with
    none registered (``only`` None: ``hyla --help``)."""
    parser = argparse.ArgumentParser(prog="hyla", description="Attention as a Hypernetwork: train, evaluate, analyze.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, summary) in SUBCOMMANDS.items():
        if name != only:
            sub.add_parser(name, help=summary)
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and err.name.startswith("hyla"):
                continue  # that part of the suite is not installed in this checkout
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``hyla ARGV``. As the process's own entry (``argv`` None) it may first re-execute itself once with
    MKL's vendor check overridden (``hyla.cpu``; ``HYLA_FAST_BLAS=off`` turns that off)."""
    own_process = argv is None
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and not argv[0].startswith("-") else None
    print_warnings_on_one_line()
    if command is not None:
        try:
            cpu.setting()  # a bad value is one line, called in-process too
            if own_process:  # before the subcommand's module imports torch: the new process imports it once
                cpu.reexec_with_override(argv)
        except ValueError as err:
            print(f"hyla: error: {err}", file=sys.stderr)
            return 2
    try:
        parser = build_parser(only=command)
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 0 if command is None else 2
        tune_cpu_allocator()
        return int(args.func(args) or 0)
    except ModuleNotFoundError as err:
        if (line := missing_extra(err)) is None:
            raise
        print(f"hyla {command}: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
