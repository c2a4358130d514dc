"""The keys and values of incremental decoding, kept between calls of ``Attention.forward(cache=...)``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class KVCache:
    """Keys and values seen so far in incremental decoding (``k_BxHxTxE``, ``v_BxHxTxD``).

    The keys are stored after RoPE, so a cached key never needs re-rotation. HYLA's value network is
    recomputed from the cached keys and values for every new query (its weights depend on q and k).
    """

    k_BxHxTxE: Tensor | None = None
    v_BxHxTxD: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k_BxHxTxE is None else self.k_BxHxTxE.shape[2]

    def append(self, k_BxHxTxE: Tensor, v_BxHxTxD: Tensor) -> tuple[Tensor, Tensor]:
        if self.k_BxHxTxE is None or self.v_BxHxTxD is None:
            self.k_BxHxTxE, self.v_BxHxTxD = k_BxHxTxE, v_BxHxTxD
        else:
            self.k_BxHxTxE = torch.cat([self.k_BxHxTxE, k_BxHxTxE], dim=2)
            self.v_BxHxTxD = torch.cat([self.v_BxHxTxD, v_BxHxTxD], dim=2)
        return self.k_BxHxTxE, self.v_BxHxTxD
