"""A mixture of GELU MLP experts applied to tokens that a router sent to ``k`` of them each: every expert on
every token, weighted by zero where not routed (``moe_dense``, the reference), or each expert on its own
tokens only (``moe_routed``).

Why two: the paper's MoE (E = 5 experts, top-2) computes 5 MLPs per token densely where 2 count. On one CPU
thread of a Zen 4, routing each expert's tokens to it took the fuzzy-logic MoE models' whole training step from
8.2-8.3 to 15.4-16.1 steps/s (``hyla bench train --task fuzzy_logic_moe``, both forms in turn). Its shapes depend on the
routing, which ``torch.compile``'s graphs, CUDA graphs (``train.graph_step``) and ``torch.vmap`` (stacked runs on a
GPU) cannot hold, and it asks the host for the counts per expert; so ``moe_experts`` routes in eager mode on a CPU
and stays dense elsewhere (the routed form is not measured on a GPU).

Both give the same function; they sum in another order, so they agree to rounding (``tests/ops/test_moe.py``).
``SETTING_ENV`` (``HYLA_MOE_DISPATCH``) ``dense`` keeps the dense form on a CPU too, e.g. to continue a run as its
earlier pieces trained.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from hyla.ops.gelu import gelu
from hyla.runtime import env_setting

#: the environment variable that keeps the dense form on a CPU (``dense``); ``auto`` (default) routes there
SETTING_ENV = "HYLA_MOE_DISPATCH"
SETTINGS = ("auto", "dense")


def moe_path() -> str:
    """What computes the experts of an eager CPU forward in this process: ``routed`` or ``dense``
    (``made_by.jsonl``); a ValueError naming the allowed values if ``SETTING_ENV`` is bad."""
    return "routed" if env_setting(SETTING_ENV, SETTINGS) == "auto" else "dense"


class Routing(NamedTuple):
    """Where the router sent each token: its ``K`` experts and their weights (renormalized to sum to 1)."""

    weights_NxK: Tensor
    experts_NxK: Tensor


class ExpertWeights(NamedTuple):
    """The ``E`` experts' two layers, stacked: ``gelu(x @ w1[e] + b1[e]) @ w2[e] + b2[e]``."""

    w1_ExDxM: Tensor
    b1_ExM: Tensor
    w2_ExMxD: Tensor
    b2_ExD: Tensor


def moe_dense(x_NxD: Tensor, routing: Routing, experts: ExpertWeights, approximate: str = "none") -> Tensor:
    """Every expert on every token; token n's output is ``sum_k weights[n, k] * expert_{experts[n, k]}(x[n])``."""
    w1_ExDxM, b1_ExM, w2_ExMxD, b2_ExD = experts
    gates_NxE = torch.zeros(x_NxD.shape[0], w1_ExDxM.shape[0], dtype=routing.weights_NxK.dtype, device=x_NxD.device)
    gates_NxE = gates_NxE.scatter(-1, routing.experts_NxK, routing.weights_NxK)
    h_NxExM = gelu(torch.einsum("nd,edm->nem", x_NxD, w1_ExDxM) + b1_ExM, approximate=approximate)
    y_NxExD = torch.einsum("nem,emd->ned", h_NxExM, w2_ExMxD) + b2_ExD
    return torch.einsum("ne,ned->nd", gates_NxE, y_NxExD)


def moe_routed(x_NxD: Tensor, routing: Routing, experts: ExpertWeights, approximate: str = "none") -> Tensor:
    """``moe_dense``'s function, each expert computed on the tokens routed to it only."""
    num_tokens, top_k = routing.experts_NxK.shape
    expert_R = routing.experts_NxK.reshape(-1)  # R = N * K (token, choice) pairs
    order_R = expert_R.argsort(stable=True)  # pairs grouped by expert, in token order within each
    token_R = torch.arange(num_tokens, device=x_NxD.device).repeat_interleave(top_k)[order_R]
    counts = torch.bincount(expert_R, minlength=experts.w1_ExDxM.shape[0]).tolist()
    per_expert = zip(*(w.unbind(0) for w in experts))
    outputs = []
    for x_CxD, (w1_DxM, b1_M, w2_MxD, b2_D) in zip(
        x_NxD.index_select(0, token_R).split(counts), per_expert, strict=True
    ):
        outputs.append(gelu(x_CxD @ w1_DxM + b1_M, approximate=approximate) @ w2_MxD + b2_D)
    y_RxD = torch.cat(outputs) * routing.weights_NxK.reshape(-1)[order_R, None]
    return torch.zeros_like(x_NxD, dtype=y_RxD.dtype).index_add(0, token_R, y_RxD)


def moe_experts(x_NxD: Tensor, routing: Routing, experts: ExpertWeights, approximate: str = "none") -> Tensor:
    """The experts' weighted sum per token: ``moe_routed`` in eager mode on a CPU, ``moe_dense`` where shapes must
    not depend on the data (compiled, captured, under ``torch.vmap``), on a GPU, or with ``SETTING_ENV=dense``."""
    routed = (
        x_NxD.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and not any(torch._C._functorch.is_batchedtensor(t) for t in (x_NxD, routing.weights_NxK, *experts))
        and moe_path() == "routed"
    )
    return (moe_routed if routed else moe_dense)(x_NxD, routing, experts, approximate)
