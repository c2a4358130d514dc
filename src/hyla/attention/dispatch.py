"""Which implementation computes attention: the policy behind ``Attention(backend=...)``.

A hyper value network (HYLA and its kin) goes to the chosen backend; a linear one (softmax attention itself,
linear attention) only where the backend covers it (``fused_cpu``, also under ``auto`` on CPU, and
``chunked``), else the direct form, silently, as before those backends covered it.

``dispatch`` returns the attention heads ``y_BxHxQxD`` or ``None`` when the caller should use the
direct form in ``hyla.attention.functional`` (whose ``attend`` does both: the one path of ``Attention`` and
of ``hyla.functional.attention``, so no caller sees the None). Which backend covers which variant (and dtype, device)
is the table ``COVERAGE`` in ``hyla.attention.kernels.coverage``. The backends (former names, still
accepted: ``reference`` for ``direct``, ``explicit`` for ``manual_backward``):

* ``direct``: the direct form, memory O(B * Q * K * D) (the hidden tensor is materialized);
* ``fused_cpu``: ``hyla.attention.kernels.c``, a C kernel (OpenMP, forward and backward) that
  never writes a ``B x H x Q x K`` tensor, built on first use with the system C compiler;
  ``value_network`` ``hyper`` or ``linear`` with every normalization, every phi, float32/float64, masks, biases
  broadcastable to ``1xHxQxK``, attention dropout, first-order gradients; registered as the custom ops
  ``hyla::fused_cpu_attention`` (+ ``_backward``), so it works under ``torch.compile`` and, with the
  runs folded into the batch, under ``torch.vmap`` (stacked runs); otherwise it raises
  ``CpuKernelUnavailableError`` naming the cause;
* ``manual_backward``: ``hyla.attention.kernels.manual_backward``, the direct form's arithmetic as an
  ``autograd.Function`` with a hand-derived backward that makes far fewer passes over the
  ``B x H x Q x K`` scores; ``value_network="hyper"`` with ``rms_head`` or ``none``, any device and
  dtype, first-order gradients, not inside ``torch.vmap``; under ``torch.compile`` it traces the
  direct form instead (Inductor fuses its passes);
* ``chunked``: ``hyla.attention.kernels.chunked``, pure PyTorch, ``chunk_size`` queries at a time,
  memory O(B * chunk * K * D) in the forward and (checkpointed) the backward, on any device;
* ``fused``: ``hyla.attention.kernels.triton``, a Triton kernel (forward and backward) that never
  materializes the hidden tensor, registered as the custom op ``hyla::fused_attention`` (autograd,
  ``torch.compile``). It runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1`` (slow: for tests).
  It covers ``value_network="hyper"`` with ``normalization`` ``rms_head`` or ``none`` (every phi),
  float32 / bfloat16 / float16, up to 32 heads and head dims up to 128, any bias broadcastable to
  ``BxHxQxK`` and any bool mask broadcastable to ``Bx1xQxK``. Asked for a case outside that
  (``hyla_softmax``, ``hyla_plus``, 64 heads, CPU without the interpreter, ...), it raises
  ``FusedUnavailableError`` (a ``NotImplementedError``) naming the cause;
* a mask that varies over heads (``B x H x Q x K`` with H > 1, which ``hyla.functional.attention`` accepts as
  SDPA does) is beyond both kernels, which take one mask for all heads: ``auto`` leaves it to
  ``manual_backward`` or the direct form, ``fused_cpu`` asked for it raises;
* with attention dropout (a keep-mask given), only the backends whose ``COVERAGE`` entry has
  ``dropout`` run it (``fused_cpu``, also when ``auto`` chooses it); the others leave it to the direct form;
* ``auto``: on CPU (any non-CUDA device), by ``cpu_auto_choice``: ``fused_cpu`` when it covers the
  case (and a C compiler is there) and head dims are at most 8 or (hyper value networks) the scores
  tensor is large, else ``manual_backward`` for head dims up to 16 when it covers the case (e.g.
  bfloat16), else the direct form, silently. On CUDA, by ``cuda_auto_choice``: the direct form for
  head dims up to 8 with fewer than 2^24 scores (the kernel would be mostly padding); else ``fused`` when
  the case is covered, otherwise the direct form, with a one-time warning per cause.
  Before ``auto`` first uses the Triton kernel for a new signature (device, dtype,
  heads, head dims, variant, bias/mask present) it runs it once on small random inputs of that
  signature, forward and backward, against the direct form (``fused_self_test``); a kernel that
  fails to compile or disagrees is not used for that signature (warning once). Under
  ``torch.compile`` tracing the check cannot run, and an unchecked signature uses the kernel (the
  trainer therefore runs one eager forward before compiling). Inside ``torch.vmap`` (stacked runs) the
  op has no batching rule: ``auto`` uses the direct form there.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from hyla.attention.config import AttentionConfig, canonical_backend
from hyla.attention.functional import hypernetwork_attention
from hyla.attention.kernels.c import fused_cpu_hypernetwork_attention, fused_cpu_unsupported_reason
from hyla.attention.kernels.chunked import chunked_hypernetwork_attention
from hyla.attention.kernels.coverage import COVERAGE, variant_unsupported_reason
from hyla.attention.kernels.errors import CpuKernelUnavailableError
from hyla.attention.kernels.manual_backward import (
    manual_backward_hypernetwork_attention,
    manual_backward_unsupported_reason,
)
from hyla.attention.kernels.triton import fused_hypernetwork_attention, fused_unsupported_reason, launch_fused

__all__ = ["cpu_auto_choice", "cuda_auto_choice", "dispatch", "fused_self_test"]

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


def _per_head_mask_reason(mask: Tensor | None) -> str | None:
    """Why the kernels cannot take ``mask`` (one that varies over heads), or None."""
    if mask is not None and mask.dim() >= 3 and mask.shape[-3] != 1:
        return f"a mask that varies over heads (shape {tuple(mask.shape)}; covered: broadcastable to Bx1xQxK)"
    return None


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


def cpu_auto_choice(
    config: AttentionConfig,
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
) -> str:
    """What ``backend="auto"`` runs on CPU for this case: ``fused_cpu``, ``manual_backward`` or ``direct``."""
    b, h, nq, e = q_BxHxQxE.shape
    head_dim = max(e, v_BxHxKxD.shape[-1])
    # (the large-scores rule was measured for HYLA; softmax attention keeps the C kernel to the head dims measured)
    large = config.is_hyper and b * h * nq * k_BxHxKxE.shape[-2] >= FUSED_CPU_MIN_SCORES
    tensors = (q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, mask, bias)
    fused_cpu_covers = _per_head_mask_reason(mask) is None and fused_cpu_unsupported_reason(config, *tensors) is None
    if (head_dim <= FUSED_CPU_MAX_HEAD_DIM or large) and fused_cpu_covers:
        return "fused_cpu"
    if torch.compiler.is_compiling():  # manual_backward is not traceable (see dispatch)
        return "direct"
    if head_dim <= MANUAL_BACKWARD_MAX_HEAD_DIM and manual_backward_unsupported_reason(config, *tensors) is None:
        return "manual_backward"
    return "direct"


#: ``auto`` on CUDA (measured on an H100): the Triton kernel pads head dims to
#: 16, so for the paper's task models (head dims 4-8, a few thousand query-key pairs per head) most of its
#: work is padding, and the direct form (which ``torch.compile`` fuses) is faster: SRAVEN HYLA with the
#: whole step as one CUDA graph ran 566 steps/s on the direct form against 433 on the kernel. Long
#: sequences keep the kernel for its memory: the direct form's hidden tensor grows as B x Q x K x D.
CUDA_DIRECT_MAX_HEAD_DIM = 8
CUDA_DIRECT_MAX_SCORES = 2**24


def cuda_auto_choice(q_BxHxQxE: Tensor, k_BxHxKxE: Tensor, v_BxHxKxD: Tensor) -> str:
    """What ``backend="auto"`` runs on CUDA, before its coverage checks: ``fused`` or ``direct``."""
    b, h, nq, e = q_BxHxQxE.shape
    small = b * h * nq * k_BxHxKxE.shape[-2] < CUDA_DIRECT_MAX_SCORES
    if max(e, v_BxHxKxD.shape[-1]) <= CUDA_DIRECT_MAX_HEAD_DIM and small:
        return "direct"
    return "fused"


def dispatch(
    backend: str,
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    config: AttentionConfig,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    w_mid_HxDxD: Tensor | None = None,
    chunk_size: int = 256,
    dropout_keep_11xQxK: Tensor | None = None,
    dropout: float = 0.0,
) -> Tensor | None:
    """``y_BxHxQxD`` from the chosen backend, or None: use the direct form.

    ``mask`` is bool broadcastable to ``BxHxQxK`` (True = may attend; the kernels take ``Bx1xQxK``), ``bias``
    broadcastable to ``BxHxQxK``; ``w_mid_HxDxD`` is the extra generated layer of ``hyper_deep`` (not fused). With
    ``dropout_keep_11xQxK`` (attention dropout at rate ``dropout``,
    ``dropout_keep_mask``) only a backend that covers dropout runs.
    ``backend`` is one of ``BACKENDS`` or a former name of one.
    """
    backend = canonical_backend(backend)
    if backend == "direct":
        return None
    if not config.is_hyper and not (
        (backend == "auto" and q_BxHxQxE.device.type != "cuda")
        or (backend in COVERAGE and variant_unsupported_reason(backend, config) is None)
    ):  # a linear value network (softmax attention itself) takes the direct form unless the backend covers it
        return None
    if dropout_keep_11xQxK is not None:  # only a backend that drops may run it: settle auto's choice first
        if backend == "auto" and q_BxHxQxE.device.type != "cuda":
            backend = cpu_auto_choice(config, q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, mask, bias)
        if not (backend in COVERAGE and COVERAGE[backend].dropout):
            return None
    drop = {"dropout_keep_11xQxK": dropout_keep_11xQxK, "dropout": dropout}
    if backend == "chunked":
        return chunked_hypernetwork_attention(
            q_BxHxQxE,
            k_BxHxKxE,
            v_BxHxKxD,
            config,
            mask_Bx1xQxK=mask,
            bias=bias,
            w_mid_HxDxD=w_mid_HxDxD,
            chunk_size=chunk_size,
        )
    q, k, v = q_BxHxQxE, k_BxHxKxE, v_BxHxKxD
    if backend == "fused":
        return fused_hypernetwork_attention(q, k, v, config, mask_Bx1xQxK=mask, bias=bias)
    if backend == "fused_cpu":
        reason = _per_head_mask_reason(mask)
        if reason is not None:
            raise CpuKernelUnavailableError(f"the fused CPU kernel does not cover {reason}")
        return fused_cpu_hypernetwork_attention(q, k, v, config, mask_Bx1xQxK=mask, bias=bias, **drop)
    if backend == "manual_backward" or (backend == "auto" and q.device.type != "cuda"):
        choice = cpu_auto_choice(config, q, k, v, mask, bias) if backend == "auto" else "manual_backward"
        if choice == "fused_cpu":
            return fused_cpu_hypernetwork_attention(q, k, v, config, mask_Bx1xQxK=mask, bias=bias, **drop)
        if choice == "direct" or torch.compiler.is_compiling():
            # manual_backward is an autograd.Function whose backward trips a PyTorch internal assert when
            # Dynamo traces it (torch 2.13); compiled, Inductor fuses the direct form's passes itself
            return None
        return manual_backward_hypernetwork_attention(q, k, v, config, mask_Bx1xQxK=mask, bias=bias)
    # auto on CUDA; shape arithmetic first, which torch.compile traces without a graph break (also in vmap)
    if cuda_auto_choice(q, k, v) == "direct":
        return None
    reason = _per_head_mask_reason(mask) or fused_unsupported_reason(q, k, v, config, mask_Bx1xQxK=mask, bias=bias)
    if reason is not None:
        _warn_once(reason)
        return None
    if not _checked(q, v, config, mask, bias):
        return None
    return launch_fused(q, k, v, config, mask_Bx1xQxK=mask, bias=bias)  # checked just above
