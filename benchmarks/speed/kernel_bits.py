"""Whether two checkouts' C kernels (``fused_cpu``) compute the same bits: ``save`` writes the output and the four
gradients of every preset the kernel covers (float32 and float64; the SRAVEN and fuzzy-logic paper sizes, which
take the kernel's specialized copies, and odd sizes, which take its general one; with a padding mask, a bias and
attention dropout) from the checkout on ``PYTHONPATH``; ``compare`` tells which cases differ (exit 1 if any).

    PYTHONPATH=/tmp/old/src python benchmarks/speed/kernel_bits.py save old.pt   # a worktree of the other commit
    PYTHONPATH=src python benchmarks/speed/kernel_bits.py save new.pt
    python benchmarks/speed/kernel_bits.py compare old.pt new.pt

A kernel change that reorders no arithmetic (a copy specialized, a loop restructured) should give ``torch.equal``
in every case; one that reorders sums will not, and is judged by the float-sensitive tests' tolerances instead.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import Tensor

#: (batch, heads, tokens, head dim): SRAVEN's and fuzzy logic's attention layers, and sizes no copy specializes
SIZES: tuple[tuple[int, int, int, int], ...] = ((8, 16, 36, 4), (8, 8, 32, 2), (4, 3, 11, 5))
DTYPES = (torch.float32, torch.float64)

Case = tuple[int, int, int, int, str, str]


def kernel_results(sizes: tuple[tuple[int, int, int, int], ...] = SIZES) -> dict[Case, list[Tensor]]:
    """{(B, H, T, E, preset, dtype): [output, dq, dk, dv, dbias]} for every preset the kernel covers, from
    inputs drawn with a fixed seed (the same on every checkout)."""
    from hyla.attention import attention_preset
    from hyla.attention.config import PRESETS
    from hyla.attention.kernels.c.wrapper import fused_cpu_hypernetwork_attention, fused_cpu_unsupported_reason

    results: dict[Case, list[Tensor]] = {}
    for batch, heads, tokens, head_dim in sizes:
        for preset in PRESETS:
            config = attention_preset(preset)
            for dtype in DTYPES:
                gen = torch.Generator().manual_seed(0)
                # the model's layout: heads strided inside tokens, as the projections leave them
                q_BxHxTxE, k_BxHxTxE, v_BxHxTxE = (
                    torch.randn(batch, tokens, heads, head_dim, generator=gen, dtype=dtype)
                    .transpose(1, 2)
                    .requires_grad_()
                    for _ in range(3)
                )
                bias_HxTxT = torch.randn(heads, tokens, tokens, generator=gen, dtype=dtype, requires_grad=True)
                mask_Bx1xTxT = torch.rand(batch, 1, tokens, tokens, generator=gen) > 0.2
                keep_11xTxT = torch.rand(1, 1, tokens, tokens, generator=gen) > 0.1
                inputs = (q_BxHxTxE, k_BxHxTxE, v_BxHxTxE)
                if fused_cpu_unsupported_reason(config, *inputs, mask_Bx1xTxT, bias_HxTxT) is not None:
                    continue
                y_BxHxTxE = fused_cpu_hypernetwork_attention(
                    *inputs,
                    config,
                    mask_Bx1xQxK=mask_Bx1xTxT,
                    bias=bias_HxTxT,
                    dropout_keep_11xQxK=keep_11xTxT,
                    dropout=0.1,
                )
                dy_BxHxTxE = torch.randn(y_BxHxTxE.shape, generator=gen, dtype=dtype)
                grads = torch.autograd.grad(y_BxHxTxE, (*inputs, bias_HxTxT), dy_BxHxTxE)
                results[(batch, heads, tokens, head_dim, preset, str(dtype))] = [y_BxHxTxE.detach(), *grads]
    return results


def differing(old: dict[Case, list[Tensor]], new: dict[Case, list[Tensor]]) -> list[str]:
    """One line for each case whose tensors are not all ``torch.equal``, or that only one side has."""
    lines = [f"{case}: only in the first file" for case in old.keys() - new.keys()]
    lines += [f"{case}: only in the second file" for case in new.keys() - old.keys()]
    names = ("output", "dq", "dk", "dv", "dbias")
    for case in sorted(old.keys() & new.keys()):
        unequal = [name for name, a, b in zip(names, old[case], new[case], strict=True) if not torch.equal(a, b)]
        if unequal:
            worst = max(float((a - b).abs().max()) for a, b in zip(old[case], new[case], strict=True))
            lines.append(f"{case}: {', '.join(unequal)} differ (largest difference {worst:.3g})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("save", help="write this checkout's results").add_argument("out")
    compare = commands.add_parser("compare", help="which cases of two saved files differ")
    compare.add_argument("first")
    compare.add_argument("second")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.command == "save":
        results = kernel_results()
        torch.save(results, args.out)
        print(f"{len(results)} cases written to {args.out}")
        return 0
    old, new = torch.load(args.first), torch.load(args.second)
    lines = differing(old, new)
    for line in lines:
        print(line)
    print(f"{len(old.keys() | new.keys()) - len(lines)} of {len(old.keys() | new.keys())} cases equal bit for bit")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
