"""HYLA with a hand-derived backward (``backend="manual_backward"``): the direct form's arithmetic in fewer
passes over the scores.

The direct form (``hyla.attention.functional``) leaves the backward to autograd, which walks the
``B x H x Q x K`` score tensor a few dozen times: scale, bias, RMSHead's square/mean/multiply, a
permuted copy of the code for each of the two head contractions, and as many again backwards. On a
CPU that tensor does not fit in cache and the head dims are tiny (SRAVEN: 16 heads of 4), so those
passes, not arithmetic, are most of a HYLA step. Here:

* the forward writes the latent code once in each layout its two contractions read: ``B x Q x H x K``
  for ``y[h,q] = sum_k a[h,q,k] g[q,k]`` (a batch of Q-row products) and ``B x K x H x Q`` for
  ``u[q,k] = sum_h a[h,q,k] v[h,k]`` (a batch of K-column products); the scale ``1/sqrt(E)`` goes on
  ``q`` (small) instead of the scores;
* RMSHead's backward needs ``m[q,k] = sum_h a[h,q,k] da[h,q,k]``; by linearity that equals
  ``sum_d g[q,k,d] dg[q,k,d] + u[q,k,d] du[q,k,d]``, a ``B x Q x K x D`` product instead of a pass
  over the code and its gradient;
* RMSHead's per-pair scale ``r[q,k]`` is folded into the small operands of the two matmuls that give
  the code's gradient, so ``ds = r da - s r^2 m / H`` costs one multiply-add;
* ``ds`` is kept as the sum of its two matmul products, each in the layout its matmul wrote
  (``B x H x Q x K`` and ``B x H x K x Q``): ``dq``, ``dk`` and the bias gradient read both, and no
  (q, k) transpose of a score-sized tensor happens in the backward.

Covers (``COVERAGE["manual_backward"]`` in ``hyla.attention.kernels.coverage``)
``value_network="hyper"`` with ``normalization`` ``rms_head`` or ``none``, every phi, the masks and
biases the direct form takes, any float dtype and device; ``backend="auto"`` uses it on CPU.
First-order gradients only (double backward raises), and not inside ``torch.vmap`` (stacked runs use
the direct form). Tested against the direct form in ``tests/attention/test_cpu_backends.py``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from hyla.attention.backend import AttentionCall, Backend
from hyla.attention.config import AttentionConfig
from hyla.attention.functional import nonlinearity
from hyla.attention.kernels.coverage import COVERAGE, dropout_unsupported_reason, variant_unsupported_reason


def manual_backward_unsupported_reason(
    config: AttentionConfig,
    q_BxHxQxE: Tensor | None = None,
    k_BxHxKxE: Tensor | None = None,
    v_BxHxKxD: Tensor | None = None,
    mask_Bx1xQxK: Tensor | None = None,
    bias: Tensor | None = None,
) -> str | None:
    """Why ``manual_backward_hypernetwork_attention`` cannot run this case, or None."""
    reason = variant_unsupported_reason("manual_backward", config)
    if reason is not None:
        return reason
    tensors = (q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, mask_Bx1xQxK, bias)
    batched = any(t is not None and torch._C._functorch.is_batchedtensor(t) for t in tensors)
    if batched and not COVERAGE["manual_backward"].vmap:
        return "inside torch.vmap (e.g. stacked runs): it has no batching rule"
    return None


def _sum_to(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum a broadcast result back to ``shape`` (same number of dims): the gradient of broadcasting."""
    dims = [i for i, (n, m) in enumerate(zip(shape, t.shape)) if n == 1 and m != 1]
    return t.sum(dim=dims, keepdim=True) if dims else t


def _bias_grad(ds1_BxHxQxK: Tensor, ds2_BxHxKxQ: Tensor, bias_shape: torch.Size) -> Tensor:
    """The bias gradient ``ds1 + ds2^T`` summed to ``bias_shape``, each part reduced in its own layout."""
    shape4 = (1,) * (4 - len(bias_shape)) + tuple(bias_shape)
    shape4_t = (*shape4[:2], shape4[3], shape4[2])
    grad = _sum_to(ds1_BxHxQxK, shape4) + _sum_to(ds2_BxHxKxQ, shape4_t).transpose(-1, -2)
    return grad.reshape(bias_shape)


def _phi_backward(phi: str, u: Tensor, g: Tensor, dg: Tensor) -> Tensor:
    """``dg * phi'(u)`` given ``g = phi(u)``; autograd of ``phi`` for the nonlinearities without a shortcut."""
    if phi == "relu":
        return torch.ops.aten.threshold_backward(dg, u, 0.0)
    if phi == "identity":
        return dg
    if phi == "tanh":
        return torch.ops.aten.tanh_backward(dg, g)
    if phi == "sigmoid":
        return torch.ops.aten.sigmoid_backward(dg, g)
    with torch.enable_grad():
        u_leaf = u.detach().requires_grad_()
        (du,) = torch.autograd.grad(nonlinearity(phi)(u_leaf), u_leaf, dg)
    return du


class _ManualBackwardHyla(torch.autograd.Function):
    @staticmethod
    def forward(
        q_BxHxQxE: Tensor,
        k_BxHxKxE: Tensor,
        v_BxHxKxD: Tensor,
        bias: Tensor | None,
        mask_Bx1xQxK: Tensor | None,
        phi: str,
        rms: bool,
        rms_eps: float,
    ) -> tuple[Tensor | None, ...]:
        b, h, nq, e = q_BxHxQxE.shape
        nk = k_BxHxKxE.shape[2]
        qs_BxHxQxE = q_BxHxQxE * (1.0 / math.sqrt(e))
        s_BxHxQxK = torch.matmul(qs_BxHxQxE, k_BxHxKxE.transpose(-1, -2))
        if bias is not None:
            s_BxHxQxK.add_(bias)
        if mask_Bx1xQxK is not None:
            s_BxHxQxK.masked_fill_(~mask_Bx1xQxK, 0.0)
        a_BxQxHxK = s_BxHxQxK.new_empty(b, nq, h, nk)
        r_Bx1xQxK = None
        if rms:
            r_Bx1xQxK = torch.rsqrt(s_BxHxQxK.square().mean(dim=1, keepdim=True) + rms_eps)
            torch.mul(s_BxHxQxK, r_Bx1xQxK, out=a_BxQxHxK.transpose(1, 2))
        else:
            a_BxQxHxK.copy_(s_BxHxQxK.transpose(1, 2))
        a_BxKxHxQ = s_BxHxQxK.new_empty(b, nk, h, nq)
        a_BxKxHxQ.copy_(a_BxQxHxK.permute(0, 3, 2, 1))
        # u[b,:,k] = a[b,k]^T v[b,k]: a batch of B*K products [q, h] @ [h, d]
        v_BxKxHxD = v_BxHxKxD.transpose(1, 2).contiguous()
        u_BxQxKxD = torch.matmul(a_BxKxHxQ.transpose(-1, -2), v_BxKxHxD).transpose(1, 2).contiguous()
        g_BxQxKxD = nonlinearity(phi)(u_BxQxKxD)
        # y[b,q] = a[b,q] g[b,q]: a batch of B*Q products [h, k] @ [k, d]
        y_BxQxHxD = torch.matmul(a_BxQxHxK, g_BxQxKxD)
        saved = (qs_BxHxQxE, v_BxKxHxD, s_BxHxQxK, r_Bx1xQxK, a_BxQxHxK, a_BxKxHxQ, u_BxQxKxD, g_BxQxKxD)
        return (y_BxQxHxD.transpose(1, 2), *saved)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
        q, k, _, bias, mask, phi, _, _ = inputs
        _, *saved = output
        ctx.mark_non_differentiable(*(t for t in saved if t is not None))
        ctx.set_materialize_grads(False)  # else autograd zero-fills a gradient for each saved output
        qs, v_BxKxHxD, s, r, a_BxQxHxK, a_BxKxHxQ, u, g = saved
        ctx.save_for_backward(qs, k, v_BxKxHxD, s, r, a_BxQxHxK, a_BxKxHxQ, u, g, mask)
        ctx.phi = phi
        ctx.bias_shape = None if bias is None else bias.shape
        ctx.scale = 1.0 / math.sqrt(q.shape[-1])

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy_BxHxQxD: Tensor | None, *_: Tensor | None) -> tuple[Tensor | None, ...]:
        if dy_BxHxQxD is None:  # y unused (gradients are not materialized)
            return (None,) * 8
        qs, k, v_BxKxHxD, s, r, a_BxQxHxK, a_BxKxHxQ, u_BxQxKxD, g_BxQxKxD, mask = ctx.saved_tensors
        b, h, nq, nk = s.shape
        dy_BxQxHxD = dy_BxHxQxD.transpose(1, 2).contiguous()
        # through y = a g
        dg_BxQxKxD = torch.matmul(a_BxQxHxK.transpose(-1, -2), dy_BxQxHxD)
        du_BxQxKxD = _phi_backward(ctx.phi, u_BxQxKxD, g_BxQxKxD, dg_BxQxKxD)
        # through u = a v
        du_BxKxQxD = du_BxQxKxD.transpose(1, 2).contiguous()
        dv_BxKxHxD = torch.matmul(a_BxKxHxQ, du_BxKxQxD)
        w_Bx1xQxK = None
        if r is not None:
            r_BxQxKx1 = r.view(b, nq, nk, 1)
            m_BxQxKx1 = torch.addcmul(g_BxQxKxD * dg_BxQxKxD, u_BxQxKxD, du_BxQxKxD).sum(-1, keepdim=True)
            w_Bx1xQxK = (r_BxQxKx1.square() * m_BxQxKx1).view(b, 1, nq, nk) * (1.0 / h)
            g_BxQxKxD = g_BxQxKxD * r_BxQxKx1
            du_BxKxQxD = du_BxKxQxD * r.view(b, nq, nk).transpose(1, 2).unsqueeze(-1)
        # ds = ds1 + ds2^T with ds1 = r da1 - s w = dy (r g)^T - s w and ds2 = r da2 = (r du) v^T
        da1_BxQxHxK = torch.matmul(dy_BxQxHxD, g_BxQxKxD.transpose(-1, -2))
        da2_BxKxHxQ = torch.matmul(v_BxKxHxD, du_BxKxQxD.transpose(-1, -2))
        ds1_BxHxQxK = s.new_empty(b, h, nq, nk)
        if mask is None and w_Bx1xQxK is not None:
            torch.addcmul(da1_BxQxHxK.transpose(1, 2), s, w_Bx1xQxK, value=-1.0, out=ds1_BxHxQxK)
        else:
            if mask is None:
                ds1_BxHxQxK.copy_(da1_BxQxHxK.transpose(1, 2))
            else:
                torch.mul(da1_BxQxHxK.transpose(1, 2), mask, out=ds1_BxHxQxK)
            if w_Bx1xQxK is not None:  # s is already 0 at masked pairs
                ds1_BxHxQxK.addcmul_(s, w_Bx1xQxK, value=-1.0)
        ds2_BxHxKxQ = s.new_empty(b, h, nk, nq)
        if mask is None:
            ds2_BxHxKxQ.copy_(da2_BxKxHxQ.transpose(1, 2))
        else:
            torch.mul(da2_BxKxHxQ.transpose(1, 2), mask.transpose(-1, -2), out=ds2_BxHxKxQ)
        dbias = None
        if ctx.needs_input_grad[3]:
            dbias = _bias_grad(ds1_BxHxQxK, ds2_BxHxKxQ, ctx.bias_shape)
        dq = torch.matmul(ds1_BxHxQxK, k)
        dq.add_(torch.matmul(ds2_BxHxKxQ.transpose(-1, -2), k)).mul_(ctx.scale)
        dk = torch.matmul(ds1_BxHxQxK.transpose(-1, -2), qs)
        dk.add_(torch.matmul(ds2_BxHxKxQ, qs))
        return dq, dk, dv_BxKxHxD.transpose(1, 2), dbias, None, None, None, None


def manual_backward_hypernetwork_attention(
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    config: AttentionConfig,
    *,
    mask_Bx1xQxK: Tensor | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """``y_BxHxQxD`` of ``hypernetwork_attention``, hand-derived backward.

    ``mask_Bx1xQxK`` is bool broadcastable to ``Bx1xQxK`` (True = may attend); ``bias`` broadcastable to
    ``BxHxQxK`` (its gradient is summed back to its shape). Raises ``ValueError`` for a case it does
    not cover (``manual_backward_unsupported_reason``).
    """
    call = AttentionCall(q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, config, mask_Bx1xQxK, bias)
    reason = manual_backward_unsupported_reason(config, *call.tensors)
    if reason is not None:
        raise MANUAL_BACKWARD.unavailable(reason)
    return MANUAL_BACKWARD(call)


def _launch(call: AttentionCall) -> Tensor:
    q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, config = call.q_BxHxQxE, call.k_BxHxKxE, call.v_BxHxKxD, call.config
    mask_Bx1xQxK, bias = call.mask, call.bias
    if mask_Bx1xQxK is not None and mask_Bx1xQxK.dim() < 4:
        mask_Bx1xQxK = mask_Bx1xQxK.reshape((1,) * (4 - mask_Bx1xQxK.dim()) + tuple(mask_Bx1xQxK.shape))
    y, *_ = _ManualBackwardHyla.apply(
        q_BxHxQxE,
        k_BxHxKxE,
        v_BxHxKxD,
        bias,
        mask_Bx1xQxK,
        config.nonlinearity,
        config.normalization == "rms_head",
        config.rms_eps,
    )
    return y


class ManualBackward(Backend):
    """The direct form's arithmetic with a hand-derived backward: far fewer passes over the scores."""

    name = "manual_backward"
    traceable = False

    def covers(self, call: AttentionCall) -> str | None:
        return manual_backward_unsupported_reason(call.config, *call.tensors) or dropout_unsupported_reason(
            self.name, call.dropout_keep_11xQxK
        )

    def __call__(self, call: AttentionCall) -> Tensor:
        return _launch(call)

    def unavailable(self, reason: str) -> Exception:
        return ValueError(f"the manual-backward form does not cover {reason}; use backend='direct'")


MANUAL_BACKWARD = ManualBackward()
