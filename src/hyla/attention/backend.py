"""The one protocol every attention backend follows: ``covers(call)`` says why it cannot run a call (None: it
can) and ``backend(call)`` computes the heads. ``hyla.attention.dispatch.choose`` picks one per forward."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from hyla.attention.config import AttentionConfig


@dataclass(frozen=True)
class AttentionCall:
    """What a backend computes attention from: projected heads, the variant, masks and dropout.

    ``mask`` is bool broadcastable to ``B x H x Q x K`` (True = may attend; the kernels take one shared over
    heads, ``B x 1 x Q x K``), ``bias`` a float score bias broadcastable to ``B x H x Q x K``; ``w_mid_HxDxD``
    is ``hyper_deep``'s extra generated layer; ``dropout_keep_11xQxK`` the pairs attention dropout keeps at rate
    ``dropout`` (None: no dropout); ``chunk_size`` the queries per block of ``chunked``."""

    q_BxHxQxE: Tensor
    k_BxHxKxE: Tensor
    v_BxHxKxD: Tensor
    config: AttentionConfig
    mask: Tensor | None = None
    bias: Tensor | None = None
    w_mid_HxDxD: Tensor | None = None
    dropout: float = 0.0
    dropout_keep_11xQxK: Tensor | None = None
    chunk_size: int = 256

    @property
    def tensors(self) -> tuple[Tensor | None, ...]:
        """The inputs a backend's device, dtype and ``torch.vmap`` checks look at."""
        return (self.q_BxHxQxE, self.k_BxHxKxE, self.v_BxHxKxD, self.mask, self.bias)


class Backend(ABC):
    """One way of computing attention (its entry in ``COVERAGE`` says what it covers)."""

    #: its ``Attention(backend=...)`` name, one of ``BACKENDS``
    name: ClassVar[str]
    #: runs under ``torch.compile`` tracing (else the direct form is traced in its place)
    traceable: ClassVar[bool] = True

    @abstractmethod
    def covers(self, call: AttentionCall) -> str | None:
        """None when this backend can run ``call``, else why not (one phrase, naming the cause)."""

    @abstractmethod
    def __call__(self, call: AttentionCall) -> Tensor:
        """The heads ``y_BxHxQxD`` of a call this backend covers (``choose`` checked it)."""

    def unavailable(self, reason: str) -> Exception:
        """The error for a call asked of this backend by name that it does not cover."""
        return ValueError(f"backend={self.name!r} cannot run this case: {reason}")

    def __repr__(self) -> str:
        return f"<hyla attention backend {self.name!r}>"


def per_head_mask_reason(mask: Tensor | None) -> str | None:
    """Why the kernels cannot take ``mask`` (one that varies over heads: they take one for all heads), or None."""
    if mask is not None and mask.dim() >= 3 and mask.shape[-3] != 1:
        return f"a mask that varies over heads (shape {tuple(mask.shape)}; covered: broadcastable to Bx1xQxK)"
    return None
