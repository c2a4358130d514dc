"""Which backend computes a forward: ``choose``, a function of the requested backend and the call, made once
per forward. What each backend covers is the table ``COVERAGE`` (``hyla.attention.kernels.coverage``) with each
backend's own ``covers``; the measured rules of ``auto`` are below; ``docs/backends.md`` tells the whole story.

A backend asked for by name runs what it covers and raises its own error naming the cause for the rest, except
what it leaves to the direct form silently: a linear value network (softmax attention itself) it does not
cover, attention dropout it does not apply, and ``manual_backward`` under ``torch.compile`` tracing.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from hyla.attention.backend import AttentionCall, Backend
from hyla.attention.config import AttentionConfig, canonical_backend
from hyla.attention.direct import DIRECT
from hyla.attention.functional import hypernetwork_attention
from hyla.attention.kernels.c.wrapper import FUSED_CPU
from hyla.attention.kernels.chunked import CHUNKED
from hyla.attention.kernels.coverage import COVERAGE, variant_unsupported_reason
from hyla.attention.kernels.manual_backward import MANUAL_BACKWARD
from hyla.attention.kernels.triton.wrapper import FUSED, fused_hypernetwork_attention

__all__ = ["BY_NAME", "choose", "cpu_auto_choice", "cuda_auto_choice", "cuda_kernel_pays", "fused_self_test"]

#: every backend by its name (``auto`` is a choice among them)
BY_NAME: dict[str, Backend] = {b.name: b for b in (DIRECT, CHUNKED, MANUAL_BACKWARD, FUSED_CPU, FUSED)}

_WARNED: set[str] = set()
#: signature -> None (the kernel passed its self-test) or why it failed
_SELF_TESTS: dict[tuple, str | None] = {}


def _warn_once(reason: str) -> None:
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(
            f"hyla attention backend='auto': the fused kernel does not cover this case ({reason}); "
            "using the direct form",
            stacklevel=3,
        )


def _signature(q: Tensor, v: Tensor, config: AttentionConfig, mask: Tensor | None, bias: Tensor | None) -> tuple:
    return (
        str(q.device),
        q.dtype,
        q.shape[1],
        q.shape[3],
        v.shape[3],
        config.normalization,
        config.nonlinearity,
        mask is not None,
        bias is not None,
    )


def fused_self_test(
    q_BxHxQxE: Tensor, v_BxHxKxD: Tensor, config: AttentionConfig, *, with_mask: bool, with_bias: bool
) -> str | None:
    """Run the fused kernel on 1 x H x 17 x 19 random inputs shaped like ``q``/``v`` (device, dtype, H, E,
    D: the same compiled kernels) forward and backward against the direct form; None if it agrees
    (relative error < 1e-3 in fp32, 5e-2 in bf16/fp16), else why not (the exception or the error)."""
    device, dtype = q_BxHxQxE.device, q_BxHxQxE.dtype
    heads, e, d = q_BxHxQxE.shape[1], q_BxHxQxE.shape[3], v_BxHxKxD.shape[3]
    gen = torch.Generator().manual_seed(0)
    nq, nk = 17, 19
    inputs = [torch.randn(1, heads, n, w, generator=gen) for n, w in ((nq, e), (nk, e), (nk, d))]
    bias = torch.randn(1, heads, nq, nk, generator=gen) if with_bias else None
    mask = (torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + 2)[None, None] if with_mask else None
    dy = torch.randn(1, heads, nq, d, generator=gen)
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    try:
        with torch.enable_grad():
            leaves = [t.to(device, dtype).requires_grad_() for t in inputs]
            ref_leaves = [t.double().requires_grad_() for t in inputs]
            b_dev = None if bias is None else bias.to(device).requires_grad_()
            b_ref = None if bias is None else bias.double().requires_grad_()
            m_dev = None if mask is None else mask.to(device)
            y = fused_hypernetwork_attention(*leaves, config, mask_Bx1xQxK=m_dev, bias=b_dev)
            ref, _ = hypernetwork_attention(*ref_leaves, config, mask_Bx1xQxK=mask, bias=b_ref)
            got = torch.autograd.grad(y, [*leaves, *([b_dev] if b_dev is not None else [])], dy.to(device, dtype))
            want = torch.autograd.grad(ref, [*ref_leaves, *([b_ref] if b_ref is not None else [])], dy.double())
    except Exception as err:  # any failure (compilation, launch) means: do not use it
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    for name, a, b in zip(("y", "dq", "dk", "dv", "dbias"), (y, *got), (ref, *want)):
        err = ((a.detach().double().cpu() - b.detach()).norm() / b.detach().norm().clamp_min(1e-30)).item()
        if not err < tol:
            return f"{name} differs from the direct form by {err:.1e} (relative; tolerance {tol:.0e})"
    return None


def _checked(q: Tensor, v: Tensor, config: AttentionConfig, mask: Tensor | None, bias: Tensor | None) -> bool:
    """Whether ``auto`` may use the fused kernel for this signature (self-test once, eagerly)."""
    key = _signature(q, v, config, mask, bias)
    if key not in _SELF_TESTS:
        if torch.compiler.is_compiling():
            return True
        _SELF_TESTS[key] = fused_self_test(q, v, config, with_mask=mask is not None, with_bias=bias is not None)
    failure = _SELF_TESTS[key]
    if failure is not None:
        _warn_once(f"its self-test failed for this signature: {failure}")
    return failure is None


#: ``auto`` on CPU (measured by a head-dim sweep on a 2-core CPU): the C kernel's loops over
#: keys beat the direct form's batched matmuls for head dims up to FUSED_CPU_MAX_HEAD_DIM, and at any
#: head dim once the direct form's ``B x H x Q x K`` tensors reach FUSED_CPU_MIN_SCORES elements
#: (32 MiB in float32: from there each of them is a fresh mmap, page-faulted in on every step);
#: ``manual_backward`` beats the direct form up to MANUAL_BACKWARD_MAX_HEAD_DIM.
FUSED_CPU_MAX_HEAD_DIM = 8
FUSED_CPU_MIN_SCORES = 2**23
MANUAL_BACKWARD_MAX_HEAD_DIM = 16


def cpu_auto_choice(call: AttentionCall) -> Backend:
    """What ``backend="auto"`` runs on CPU (any non-CUDA device): ``fused_cpu``, ``manual_backward`` or the
    direct form, each only where it covers the call (dropout included)."""
    q, k, v = call.q_BxHxQxE, call.k_BxHxKxE, call.v_BxHxKxD
    b, h, nq, e = q.shape
    head_dim = max(e, v.shape[-1])
    # (the large-scores rule was measured for HYLA; softmax attention keeps the C kernel to the head dims measured)
    large = call.config.is_hyper and b * h * nq * k.shape[-2] >= FUSED_CPU_MIN_SCORES
    if (head_dim <= FUSED_CPU_MAX_HEAD_DIM or large) and FUSED_CPU.covers(call) is None:
        return FUSED_CPU
    if head_dim <= MANUAL_BACKWARD_MAX_HEAD_DIM and _runs(MANUAL_BACKWARD, call):
        return MANUAL_BACKWARD
    return DIRECT


#: ``auto`` on CUDA (measured on an H100): the Triton kernel pads head dims to
#: 16, so for the paper's task models (head dims 4-8, a few thousand query-key pairs per head) most of its
#: work is padding, and the direct form (which ``torch.compile`` fuses) is faster: SRAVEN HYLA with the
#: whole step as one CUDA graph ran 566 steps/s on the direct form against 433 on the kernel. Long
#: sequences keep the kernel for its memory: the direct form's hidden tensor grows as B x Q x K x D.
CUDA_DIRECT_MAX_HEAD_DIM = 8
CUDA_DIRECT_MAX_SCORES = 2**24


def cuda_kernel_pays(call: AttentionCall) -> bool:
    """Whether on CUDA the Triton kernel beats the direct form at these sizes (shape arithmetic only, which
    ``torch.compile`` traces without a graph break, also in ``torch.vmap``)."""
    q, k, v = call.q_BxHxQxE, call.k_BxHxKxE, call.v_BxHxKxD
    b, h, nq, e = q.shape
    small = b * h * nq * k.shape[-2] < CUDA_DIRECT_MAX_SCORES
    return not (max(e, v.shape[-1]) <= CUDA_DIRECT_MAX_HEAD_DIM and small)


def cuda_auto_choice(call: AttentionCall) -> Backend:
    """What ``backend="auto"`` runs on CUDA: the Triton kernel where it pays at these sizes, covers the call
    and passed its self-test for the call's signature, else the direct form (warning once per cause)."""
    if not cuda_kernel_pays(call):
        return DIRECT
    q, v = call.q_BxHxQxE, call.v_BxHxKxD
    if not call.config.is_hyper or call.dropout_keep_11xQxK is not None:
        return DIRECT
    reason = FUSED.covers(call)
    if reason is not None:
        _warn_once(reason)
        return DIRECT
    if not _checked(q, v, call.config, call.mask, call.bias):
        return DIRECT
    return FUSED


def _runs(backend: Backend, call: AttentionCall) -> bool:
    """Whether ``backend`` may run ``call`` here: it covers it and, under ``torch.compile`` tracing, is
    traceable (``manual_backward``'s backward trips a PyTorch internal assert when Dynamo traces it, torch
    2.13; compiled, Inductor fuses the direct form's passes itself)."""
    return backend.covers(call) is None and (backend.traceable or not torch.compiler.is_compiling())


def choose(requested: str, call: AttentionCall) -> Backend:
    """The backend that computes ``call`` when ``requested`` (one of ``BACKENDS``, already canonical) is asked
    for: never None (the direct form is a backend too).

    Raises:
        the requested backend's own error (``CpuKernelUnavailableError``, ``FusedUnavailableError``,
        ``ValueError``) where it was asked for by name and does not cover the call.
    """
    if requested == "auto":
        return cuda_auto_choice(call) if call.q_BxHxQxE.device.type == "cuda" else cpu_auto_choice(call)
    if requested not in BY_NAME:  # a former name, mapped with its warning, or one that names the choices
        requested = canonical_backend(requested)
        if requested == "auto":
            return choose(requested, call)
    backend = BY_NAME[requested]
    if backend is DIRECT:
        return DIRECT
    config = call.config
    coverage = COVERAGE[requested]
    left_to_direct = (
        (not config.is_hyper and variant_unsupported_reason(requested, config) is not None)
        or (call.dropout_keep_11xQxK is not None and not coverage.dropout)
        or (not backend.traceable and torch.compiler.is_compiling())
    )
    if left_to_direct:
        return DIRECT
    reason = backend.covers(call)
    if reason is not None:
        raise backend.unavailable(reason)
    return backend
