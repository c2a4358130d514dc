"""Write ``src/hyla/tasks/sraven_authors_heldout.json``: the SRAVEN tasks the authors' code holds out per seed.

Their ``hyla/data/raven.py`` (``SymbolicRavenGenerator``) orders the 330 rule multisets as
``itertools.combinations_with_replacement(range(8), 4)`` (as ours does) and holds out the first
``int(330 * 0.25)`` = 82 of ``jax.random.permutation(jax.random.key(seed), 330)``. JAX is never a dependency of
ours, so the sets are tabulated once, here, in the authors' environment (``lab/authors/authors_side_by_side.sh
venv`` makes it), and ``data.heldout_draw=authors`` reads the table.

Usage: JAX_PLATFORMS=cpu $AUTHORS_VENV/bin/python lab/authors/authors_heldout.py [--seeds 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from itertools import combinations_with_replacement
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "src" / "hyla" / "tasks" / "sraven_authors_heldout.json"


def main() -> None:
    import jax
    import jax.numpy as jnp

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=10, help="tabulate seeds 0..N-1")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    num_tasks = len(list(combinations_with_replacement(range(8), 4)))
    held = int(num_tasks * 0.25)
    seeds = {
        str(s): sorted(int(i) for i in jax.random.permutation(jax.random.key(s), jnp.arange(num_tasks))[:held])
        for s in range(args.seeds)
    }
    about = (
        "The SRAVEN rule combinations (indices into the 330 sorted multisets of 4 of the 8 rules, "
        "itertools.combinations_with_replacement order) that the authors' code holds out as its 'ood' split for "
        "each seed: jax.random.permutation(jax.random.key(seed), 330)[:82] in hyla/data/raven.py of "
        f"smonsays/hypernetwork-attention af9805f, computed with jax {jax.__version__} (JAX_THREEFRY_PARTITIONABLE "
        "unset); written by lab/authors/authors_heldout.py."
    )
    lines = ["{", f' "about": {json.dumps(about)},', f' "num_tasks": {num_tasks},', ' "seeds": {']
    rows = [f'  "{k}": {json.dumps(v)}' for k, v in seeds.items()]
    lines.append(",\n".join(rows))
    args.out.write_text("\n".join([*lines, " }", "}"]) + "\n")
    print(f"wrote {args.out}: seeds 0-{args.seeds - 1}, {held} of {num_tasks} tasks each")


if __name__ == "__main__":
    main()
