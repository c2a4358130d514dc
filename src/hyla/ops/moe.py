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


def _expert(x_NxD: Tensor, w1_DxM: Tensor, b1_M: Tensor, w2_MxD: Tensor, b2_D: Tensor, approximate: str) -> Tensor:
    return gelu(x_NxD @ w1_DxM + b1_M, approximate=approximate) @ w2_MxD + b2_D


def moe_dense(
    x_NxD: Tensor,
    weights_NxK: Tensor,
    experts_NxK: Tensor,
    w1_ExDxM: Tensor,
    b1_ExM: Tensor,
    w2_ExMxD: Tensor,
    b2_ExD: Tensor,
    approximate: str = "none",
) -> Tensor:
    """Every expert on every token; token n's output is ``sum_k weights[n, k] * expert_{experts[n, k]}(x[n])``."""
    gates_NxE = torch.zeros(x_NxD.shape[0], w1_ExDxM.shape[0], dtype=weights_NxK.dtype, device=x_NxD.device)
    gates_NxE = gates_NxE.scatter(-1, experts_NxK, weights_NxK)
    h_NxExM = gelu(torch.einsum("nd,edm->nem", x_NxD, w1_ExDxM) + b1_ExM, approximate=approximate)
    y_NxExD = torch.einsum("nem,emd->ned", h_NxExM, w2_ExMxD) + b2_ExD
    return torch.einsum("ne,ned->nd", gates_NxE, y_NxExD)


def moe_routed(
    x_NxD: Tensor,
    weights_NxK: Tensor,
    experts_NxK: Tensor,
    w1_ExDxM: Tensor,
    b1_ExM: Tensor,
    w2_ExMxD: Tensor,
    b2_ExD: Tensor,
    approximate: str = "none",
) -> Tensor:
    """``moe_dense``'s function, each expert computed on the tokens routed to it only."""
    num_tokens, top_k = experts_NxK.shape
    expert_R = experts_NxK.reshape(-1)  # R = N * K (token, choice) pairs
    order_R = expert_R.argsort(stable=True)  # pairs grouped by expert, in token order within each
    token_R = torch.arange(num_tokens, device=x_NxD.device).repeat_interleave(top_k)[order_R]
    counts = torch.bincount(expert_R, minlength=w1_ExDxM.shape[0]).tolist()
    x_RxD = x_NxD.index_select(0, token_R)
    params = zip(w1_ExDxM.unbind(0), b1_ExM.unbind(0), w2_ExMxD.unbind(0), b2_ExD.unbind(0), strict=True)
    y_RxD = torch.cat([_expert(x, *p, approximate) for x, p in zip(x_RxD.split(counts), params, strict=True)])
    y_RxD = y_RxD * weights_NxK.reshape(-1)[order_R, None].to(y_RxD.dtype)
    return torch.zeros_like(x_NxD, dtype=y_RxD.dtype).index_add(0, token_R, y_RxD)


def moe_experts(
    x_NxD: Tensor,
    weights_NxK: Tensor,
    experts_NxK: Tensor,
    w1_ExDxM: Tensor,
    b1_ExM: Tensor,
    w2_ExMxD: Tensor,
    b2_ExD: Tensor,
    approximate: str = "none",
) -> Tensor:
    """The experts' weighted sum per token: ``moe_routed`` in eager mode on a CPU, ``moe_dense`` where shapes must
    not depend on the data (compiled, captured, under ``torch.vmap``), on a GPU, or with ``SETTING_ENV=dense``."""
    tensors = (x_NxD, weights_NxK, w1_ExDxM, b1_ExM, w2_ExMxD, b2_ExD)
    routed = (
        x_NxD.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and not any(torch._C._functorch.is_batchedtensor(t) for t in tensors)
        and moe_path() == "routed"
    )
    fn = moe_routed if routed else moe_dense
    return fn(x_NxD, weights_NxK, experts_NxK, w1_ExDxM, b1_ExM, w2_ExMxD, b2_ExD, approximate)
