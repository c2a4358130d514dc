"""Why a stack lays out and updates its runs' parameters as it does (``hyla.train.engines.stacked.stack_layout``,
``StackedAdamW.update``): two CPU facts that would make a stacked run leave its lone run in the last bits.

* ``address``: ``x @ w`` and ``g @ w.T`` with ``w`` a view at 0-16 floats into a buffer, against the same
  products with a fresh ``w`` (the allocator's 64-byte alignment); how many cases differ, and at which rows and
  offsets.
* ``adamw_tail``: torch's fused AdamW on one 4,096-element tensor against the same values cut into tensors of
  1, 2, 4, ... 2,048 elements; how many second moments differ for each cut (a short tensor is all scalar tail).

Usage: OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/speed/stack_bits.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.optim.adamw import adamw

SHAPES = ((64, 256), (128, 512), (96, 384), (32, 128))  # (D, M) of a weight
ROWS = (1, 3, 7, 17, 33, 100, 257)
OFFSETS = range(17)  # floats into the buffer
FUSED = {"fused": True, "amsgrad": False, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "maximize": False}


def address() -> dict:
    """Every (D, M, rows, offset) case whose forward or backward product differs from the fresh weight's."""
    gen = torch.Generator().manual_seed(0)
    differing, cases = [], 0
    for dim, width in SHAPES:
        for rows in ROWS:
            x_CxD = torch.randn(rows, dim, generator=gen)
            g_CxM = torch.randn(rows, width, generator=gen)
            w_DxM = torch.randn(dim, width, generator=gen)
            fresh = (x_CxD @ w_DxM, g_CxM @ w_DxM.T)
            for offset in OFFSETS:
                buffer = torch.empty(offset + dim * width + 16)
                view_DxM = buffer[offset : offset + dim * width].view(dim, width)
                view_DxM.copy_(w_DxM)
                cases += 1
                moved = (x_CxD @ view_DxM, g_CxM @ view_DxM.T)
                if not all(torch.equal(a, b) for a, b in zip(moved, fresh)):
                    differing.append({"D": dim, "M": width, "rows": rows, "offset_floats": offset})
    return {"cases": cases, "differing": len(differing), "which": differing}


def adamw_tail(size: int = 4096) -> dict:
    """Second moments that differ from the one-tensor update, per length of the tensors the values are cut into."""
    gen = torch.Generator().manual_seed(0)
    p, g = torch.randn(size, generator=gen), torch.randn(size, generator=gen)
    m, v = torch.randn(size, generator=gen) * 0.1, torch.rand(size, generator=gen) * 0.01

    def second_moments(cut: int) -> torch.Tensor:
        ps, ms, vs = ([t[i : i + cut].clone() for i in range(0, size, cut)] for t in (p, m, v))
        gs = [g[i : i + cut] for i in range(0, size, cut)]
        steps = [torch.tensor(3.0) for _ in ps]
        adamw(ps, gs, ms, vs, [], steps, lr=1e-3, weight_decay=0.0, **FUSED)
        return torch.cat(vs)

    whole = second_moments(size)
    cuts = [2**k for k in range(12)]
    return {"size": size, "differing_by_cut": {c: int((second_moments(c) != whole).sum()) for c in cuts}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    found = {"torch": torch.__version__, "threads": torch.get_num_threads(), "address": address()}
    found["adamw_tail"] = adamw_tail()
    where = found["address"]
    print(f"address: {where['differing']} of {where['cases']} cases differ")
    for rows in sorted({d["rows"] for d in where["which"]}):
        offsets = sorted({d["offset_floats"] for d in where["which"] if d["rows"] == rows})
        print(f"  rows {rows}: offsets (floats) {offsets}")
    tail = found["adamw_tail"]
    print(f"adamw_tail: second moments differing from one {tail['size']}-element tensor, by tensor length:")
    print("  " + ", ".join(f"{c}: {n}" for c, n in tail["differing_by_cut"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)


if __name__ == "__main__":
    main()
