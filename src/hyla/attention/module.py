"""``Attention``: one multi-head attention module for every variant of the paper.

Example::

    attn = Attention(dim=128, num_heads=16, attention="hyla", qk_dim=64, v_dim=64)
    y_BxTxD, latent_BxHxTxT = attn(x_BxTxD, return_latent=True)

Every intermediate passes through a named ``HookPoint`` (``hook_q``, ``hook_k``, ``hook_v``,
``hook_scores``, ``hook_latent``, ``hook_hidden``, ``hook_heads``), so ``register_forward_hook`` on
e.g. ``model.blocks[0].attn.hook_latent`` reads or edits the latent code.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import replace

import torch
from torch import Tensor, nn

from hyla.attention import functional as fn
from hyla.attention.attend import attend
from hyla.attention.cache import KVCache
from hyla.attention.config import AttentionConfig, attention_preset, canonical_backend
from hyla.attention.direct import DirectFormHooks
from hyla.attention.functional import causal_mask
from hyla.attention.hypernetwork import GeneratedValueNetwork, generated_value_network
from hyla.attention.position import RelativePositionBias, apply_rope, rope_angles


class HookPoint(nn.Module):
    """Identity module marking a named intermediate; attach forward hooks to read or replace it."""

    def forward(self, x: Tensor) -> Tensor:
        return x

    @property
    def has_hooks(self) -> bool:
        return bool(self._forward_hooks or self._forward_pre_hooks)


class Attention(nn.Module):
    """Multi-head attention parameterized by the paper's orthogonal choices.

    Masks: a boolean mask is True where a query may attend to a key, wherever one is taken (as in
    ``torch.nn.functional.scaled_dot_product_attention`` and ``hyla.functional.attention``). ``causal=True``
    masks keys after each query; ``forward``'s ``key_mask`` (``B x K``) masks keys per example and its
    ``attn_mask`` (bool, or float added to the scores, broadcastable to ``B x H x Q x K``) any pairs; what they
    mask together is masked. A masked pair takes no part in the attention, also in HYLA's and linear attention's
    sums, which have no softmax to zero it: there a float ``attn_mask`` is read as the mask it means (entries
    at or below -1e4, or -inf, not attended; any other entry must be 0, else ``ValueError``), while softmax adds
    it as SDPA does (only -inf removes a key exactly). A query with no key to attend gets 0 from the attention
    (the empty sum; SDPA in PyTorch 2.13 also gives 0, older releases NaN), so its output is ``out_proj``'s bias.
    The former ``key_padding_mask`` (True at padded keys, ``nn.MultiheadAttention``'s convention) still works
    but is deprecated (a ``DeprecationWarning``): ``key_mask=~key_padding_mask`` is the same.

    Cost against the sequence length T: every variant computes all query-key pairs, so time grows as
    B H T^2 (head widths); HYLA's value network does H times more multiply-adds per pair than softmax
    attention's. Measured on a 2-core CPU (float32, H = 16, head width 64, B T = 4096, forward + backward):
    HYLA's C kernel 1.0 / 2.4 / 4.7 s at T = 256 / 512 / 1024, PyTorch's SDPA softmax 0.12 / 0.19 / 0.37 s.
    Memory: the direct form holds ``B x H x T x T`` tensors, so it grows as B H T^2 (6.1 GB at T = 1024
    there); the fused kernels (C on CPU, Triton on CUDA) hold none (0.4 GB). See the docs' backends page.

    Args:
        dim: width of the query stream (and of the output unless ``out_dim``).
        num_heads: H.
        attention: preset name (``"softmax"``, ``"linear"``, ``"hyla"``, ... see ``PRESETS``) or an
            ``AttentionConfig``.
        qk_dim: TOTAL query/key width, split over heads (the paper's convention); default ``dim``. Give
            ``head_dim_qk`` instead to set the per-head width.
        v_dim: TOTAL value width, split over heads; default ``dim`` (``head_dim_v``: per head).
        kv_dim: width of the key/value stream for cross-attention (default ``dim``).
        out_dim: output width (default ``dim``).
        causal: mask keys after the query (position-wise, with the decoding offset).
        relative_position: add a learned T5 relative-position bias per head (own table per module);
            ``num_buckets``/``max_distance`` configure it.
        relative_position_bidirectional: separate buckets for keys before and after the query
            (default: True unless causal). False puts every key after the query in the query's own
            bucket 0, as the paper's code does for its non-causal task models.
        dropout: while training, drop (q, k) pairs of the latent code with this probability (one
            ``1 x 1 x Q x K`` mask shared over batch and heads, kept pairs scaled by ``1 / (1 - p)``),
            after normalization, so a hyper value network sees the dropped code in every generated
            layer (the paper's code: ``attention_dropout_rate=0.1``). Of the kernels only the C kernel
            (``fused_cpu``, also under ``auto``) drops; the others leave a training step with dropout to
            the direct form.
        rope: rotate queries and keys (needs even ``head_dim_qk``).
        bias: biases in the four projections.
        nonlinearity: override the preset's phi.
        key_normalization: override the preset's: ``"none"`` (the paper's sum over keys) or ``"count"`` (ours: the
            sum over keys divided by the number of keys the query sees, on every backend; not with softmax).
        backend: ``auto`` | ``direct`` | ``manual_backward`` | ``fused_cpu`` | ``fused`` | ``chunked``; how
            the attention is computed (see ``hyla.attention.dispatch``: ``auto`` is ``fused``,
            the Triton kernel, on CUDA and ``fused_cpu``, a C kernel, on CPU, each where it covers the case;
            ``direct`` is the vectorized form of ``hyla.attention.functional``; ``manual_backward`` the
            same with a hand-derived backward; ``chunked`` processes ``chunk_size`` queries at a time). The
            former names ``reference`` (= ``direct``) and ``explicit`` (= ``manual_backward``) are still
            accepted, with a ``DeprecationWarning``. The latent code and hooks always use the direct form.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attention: str | AttentionConfig = "hyla",
        *,
        qk_dim: int | None = None,
        v_dim: int | None = None,
        head_dim_qk: int | None = None,
        head_dim_v: int | None = None,
        kv_dim: int | None = None,
        out_dim: int | None = None,
        causal: bool = False,
        relative_position: bool = False,
        num_buckets: int = 32,
        max_distance: int = 128,
        relative_position_bidirectional: bool | None = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        dropout: float = 0.0,
        bias: bool = True,
        nonlinearity: str | None = None,
        key_normalization: str | None = None,
        backend: str = "auto",
        chunk_size: int = 256,
    ) -> None:
        super().__init__()
        config = attention if isinstance(attention, AttentionConfig) else attention_preset(attention)
        overrides = {"nonlinearity": nonlinearity, "key_normalization": key_normalization}
        config = replace(config, **{name: value for name, value in overrides.items() if value is not None})
        for name, value in (("dim", dim), ("num_heads", num_heads)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        backend = canonical_backend(backend)
        self.config = config
        self.dim, self.num_heads = dim, num_heads
        self.head_dim_qk = _head_dim("qk_dim", qk_dim, head_dim_qk, dim, num_heads)
        self.head_dim_v = _head_dim("v_dim", v_dim, head_dim_v, dim, num_heads)
        if rope and self.head_dim_qk % 2:
            raise ValueError(f"rope=True needs an even query/key head dim, got head_dim_qk={self.head_dim_qk}")
        self.kv_dim = kv_dim or dim
        self.out_dim = out_dim or dim
        self.causal, self.rope, self.rope_base, self.backend = causal, rope, rope_base, backend
        self.chunk_size, self.dropout = chunk_size, dropout

        self.q_proj = nn.Linear(dim, num_heads * self.head_dim_qk, bias=bias)
        self.k_proj = nn.Linear(self.kv_dim, num_heads * self.head_dim_qk, bias=bias)
        self.v_proj = nn.Linear(self.kv_dim, num_heads * self.head_dim_v, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim_v, self.out_dim, bias=bias)
        self.w_mid_HxDxD = (
            nn.Parameter(torch.randn(num_heads, self.head_dim_v, self.head_dim_v) * self.head_dim_v**-0.5)
            if config.value_network == "hyper_deep"
            else None
        )
        bidirectional = (not causal) if relative_position_bidirectional is None else relative_position_bidirectional
        self.relative_position = (
            RelativePositionBias(
                num_heads,
                num_buckets,
                max_distance,
                bidirectional=bidirectional,
            )
            if relative_position
            else None
        )
        for name in ("q", "k", "v", "scores", "latent", "hidden", "heads"):
            setattr(self, f"hook_{name}", HookPoint())

    def extra_repr(self) -> str:
        c = self.config
        counted = f"key_normalization={c.key_normalization}, " if c.key_normalization != "none" else ""
        return (
            f"normalization={c.normalization}, value_network={c.value_network}, phi={c.nonlinearity}, {counted}"
            f"heads={self.num_heads}, head_dim_qk={self.head_dim_qk}, head_dim_v={self.head_dim_v}, "
            f"causal={self.causal}, rope={self.rope}, dropout={self.dropout}, backend={self.backend}"
        )

    # ------------------------------------------------------------------ projections and masks
    def _split_heads(self, x_BxTxHE: Tensor, head_dim: int) -> Tensor:
        b, t, _ = x_BxTxHE.shape
        return x_BxTxHE.view(b, t, self.num_heads, head_dim).transpose(1, 2)

    def project(
        self, x_BxQxD: Tensor, context_BxKxC: Tensor | None = None, q_offset: int = 0
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries ``q_BxHxQxE``, keys ``k_BxHxKxE`` (both after RoPE) and values ``v_BxHxKxD``."""
        self._check_inputs(x_BxQxD, context_BxKxC)
        kv = x_BxQxD if context_BxKxC is None else context_BxKxC
        q = self._split_heads(self.q_proj(x_BxQxD), self.head_dim_qk)
        k = self._split_heads(self.k_proj(kv), self.head_dim_qk)
        v = self._split_heads(self.v_proj(kv), self.head_dim_v)
        if self.rope:
            q_pos = torch.arange(q_offset, q_offset + q.shape[2], device=q.device)
            k_offset = q_offset if context_BxKxC is None else 0
            k_pos = torch.arange(k_offset, k_offset + k.shape[2], device=k.device)
            q = apply_rope(q, *rope_angles(q_pos, self.head_dim_qk, self.rope_base, q.dtype))
            k = apply_rope(k, *rope_angles(k_pos, self.head_dim_qk, self.rope_base, k.dtype))
        return self.hook_q(q), self.hook_k(k), self.hook_v(v)

    def _check_inputs(self, x: Tensor, context: Tensor | None) -> None:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (batch, queries, dim={self.dim}), got {tuple(x.shape)}")
        if context is not None:
            if context.dim() != 3 or context.shape[-1] != self.kv_dim:
                raise ValueError(
                    f"context must have shape (batch, keys, kv_dim={self.kv_dim}), got {tuple(context.shape)}"
                )
            if context.shape[0] != x.shape[0]:
                raise ValueError(f"context batch {context.shape[0]} does not match x batch {x.shape[0]}")

    def mask_and_bias(
        self,
        batch: int,
        num_queries: int,
        num_keys: int,
        q_offset: int,
        like: Tensor,
        key_mask_BxK: Tensor | None = None,
        attn_mask: Tensor | None = None,
        attn_bias: Tensor | None = None,
    ) -> tuple[Tensor | None, Tensor | None]:
        """A forward's bool pair mask (True = may attend: causality, ``key_mask_BxK``, ``attn_mask``; ``Bx1xQxK``
        unless it varies over heads; or None) and score bias; ``like`` gives the device and dtype."""
        bias = self.score_bias(num_queries, num_keys, q_offset, attn_bias)
        mask = causal_mask(num_queries, num_keys, like.device, q_offset) if self.causal else None  # offset: a cache
        if key_mask_BxK is not None:
            _check_key_mask("key_mask", key_mask_BxK, batch, num_keys, "True at keys to attend")
            keep = key_mask_BxK[:, None, None, :]
            mask = keep if mask is None else mask & keep
        if attn_mask is not None:
            shape = (batch, self.num_heads, num_queries, num_keys)
            pair_mask, bias = fn.mask_and_bias(attn_mask, self.config.normalization, shape, like.dtype, bias)
            mask = pair_mask if mask is None else mask & pair_mask
        return mask, bias

    def score_bias(self, num_queries: int, num_keys: int, q_offset: int, attn_bias: Tensor | None) -> Tensor | None:
        """Additive per-head bias (relative positions and/or the caller's), broadcastable to BxHxQxK."""
        bias = None
        if self.relative_position is not None:
            bias = self.relative_position(num_queries, num_keys, q_offset)[None]
        if attn_bias is not None:
            try:
                torch.broadcast_shapes(attn_bias.shape, (1, self.num_heads, num_queries, num_keys))
            except RuntimeError:
                raise ValueError(
                    f"attn_bias must broadcast to (batch, heads={self.num_heads}, queries={num_queries}, "
                    f"keys={num_keys}), got {tuple(attn_bias.shape)}"
                ) from None
            bias = attn_bias if bias is None else bias + attn_bias
        return bias

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        x_BxQxD: Tensor,
        context_BxKxC: Tensor | None = None,
        *,
        key_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        attn_bias: Tensor | None = None,
        cache: KVCache | None = None,
        q_offset: int = 0,
        return_latent: bool = False,
        dropout_keep: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``x`` (queries) to ``context`` (keys/values; ``x`` itself when None).

        Args:
            x_BxQxD: the queries' stream.
            context_BxKxC: the keys' and values' stream (cross-attention), or None: ``x`` (self-attention).
            key_mask: bool ``BxK``, True at keys to attend (with a cache: all cached keys).
            attn_mask: bool (True = attend) or float (added to the scores; see the class's "Masks"),
                broadcastable to ``BxHxQxK``, as ``scaled_dot_product_attention``'s; combined with ``causal``
                and ``key_mask``.
            attn_bias: additive score bias broadcastable to ``BxHxQxK``.
            cache: a ``KVCache`` for incremental decoding; the new keys/values are appended and
                the queries are placed after the cached positions.
            q_offset: position of the first query within the key sequence (for causality, relative
                positions and RoPE), e.g. ``T - P`` when ``x`` holds the last P tokens of ``context``.
            return_latent: also return the latent code ``a_BxHxQxK`` (the normalized scores).
            dropout_keep: while dropout applies (training, ``dropout > 0``), the (q, k) pairs to keep, bool
                ``1 x 1 x Q x K`` (``hyla.attention.functional.draw_keep_mask``), instead of drawing them from
                torch's default generator: for a caller that chooses each forward's masks (a stack of runs).
            key_padding_mask: deprecated, ``~key_mask``: bool ``BxK``, True at padded keys.

        Returns:
            The output ``B x Q x out_dim``, and the latent code with ``return_latent``.
        """
        if cache is not None and context_BxKxC is not None:
            raise ValueError("cache is for self-attention decoding; pass context=None with a cache")
        if cache is not None and q_offset:
            raise ValueError("q_offset is implied by the cache length; do not pass both")
        q_offset = cache.length if cache is not None else q_offset
        q, k, v = self.project(x_BxQxD, context_BxKxC, q_offset)
        if cache is not None:
            k, v = cache.append(k, v)
        b, nq, nk = q.shape[0], q.shape[2], k.shape[2]
        if key_padding_mask is not None:
            key_mask = _from_key_padding_mask(key_mask, key_padding_mask, b, nk)
        if cache is not None and key_mask is not None and key_mask.shape[-1] != nk:
            raise ValueError("with a cache, key_mask must cover all cached keys (batch, cache length)")
        mask, bias = self.mask_and_bias(b, nq, nk, q_offset, q, key_mask, attn_mask, attn_bias)
        y_BxHxQxD, a = self._attend(q, k, v, mask, bias, return_latent, dropout_keep)
        y_BxHxQxD = self.hook_heads(y_BxHxQxD)
        out = self.out_proj(y_BxHxQxD.transpose(1, 2).reshape(b, nq, -1))
        return (out, a) if return_latent else out

    def _uses_direct_form(self, need_latent: bool) -> bool:
        if need_latent or self.backend == "direct":
            return True
        hooks = (self.hook_scores, self.hook_latent, self.hook_hidden)
        return any(h.has_hooks for h in hooks)

    @property
    def _drops(self) -> bool:
        return self.training and self.dropout > 0

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        bias: Tensor | None,
        need_latent: bool,
        dropout_keep: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        nq, nk = q.shape[2], k.shape[2]
        if dropout_keep is not None:
            _check_dropout_keep(dropout_keep, self._drops, nq, nk)
        elif self._drops:  # drawn before anything else uses the generator: the same mask whichever form runs
            dropout_keep = fn.draw_keep_mask(nq, nk, self.dropout, q.device)
        keep = dropout_keep
        return attend(
            q,
            k,
            v,
            self.config,
            mask=mask,
            bias=bias,
            backend=self.backend,
            w_mid_HxDxD=self.w_mid_HxDxD,
            chunk_size=self.chunk_size,
            dropout=self.dropout,
            dropout_keep_11xQxK=keep,
            direct_form=self._uses_direct_form(need_latent),
            hooks=DirectFormHooks(self.hook_scores, self.hook_latent, self.hook_hidden),
        )

    # ------------------------------------------------------------------ the hypernetwork view
    @torch.no_grad()
    def latent_code(self, x_BxQxD: Tensor, context_BxKxC: Tensor | None = None, **kwargs: Tensor | None) -> Tensor:
        """The latent code ``a_BxHxQxK`` for these inputs (no gradient); ``kwargs`` as ``forward``'s."""
        _, a = self.forward(x_BxQxD, context_BxKxC, return_latent=True, **kwargs)  # type: ignore[misc]
        return a

    def value_network_weights(
        self,
        x_BxQxD: Tensor,
        context_BxKxC: Tensor | None = None,
        *,
        key_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        attn_bias: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
    ) -> GeneratedValueNetwork:
        """Materialize the key-query specific value network ``W[q,k]`` (memory B*Q*K*O*I: small inputs).

        ``self.value_network_weights(x)(x)`` equals ``self(x)``; tests use this as the proof that the
        module is a hypernetwork. The masks and bias as ``forward``'s (``key_padding_mask`` deprecated).
        """
        batch, num_keys = x_BxQxD.shape[0], (x_BxQxD if context_BxKxC is None else context_BxKxC).shape[1]
        if key_padding_mask is not None:
            key_mask = _from_key_padding_mask(key_mask, key_padding_mask, batch, num_keys)
        _, a = self.forward(
            x_BxQxD, context_BxKxC, key_mask=key_mask, attn_mask=attn_mask, attn_bias=attn_bias, return_latent=True
        )
        counts = None
        if self.config.key_normalization == "count":
            mask, _ = self.mask_and_bias(batch, a.shape[2], num_keys, 0, a, key_mask, attn_mask, attn_bias)
            counts = fn.visible_keys(mask, num_keys, a.dtype)
        return generated_value_network(self, a, counts)


#: torch's own frames (``nn.Module.__call__``, ``torch.no_grad``) lie between a caller and ``forward``
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _caller_stacklevel() -> int:
    """The ``warnings.warn`` stacklevel, for the function that calls this one, of the first frame outside this
    file and torch: the code that called the module, which is what a deprecation names (and Python shows a
    ``DeprecationWarning`` only when it names code in ``__main__``)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (
        frame.f_code.co_filename == __file__ or frame.f_code.co_filename.startswith(_TORCH_DIR)
    ):
        frame, level = frame.f_back, level + 1
    return level


def _check_dropout_keep(keep: Tensor, drops: bool, num_queries: int, num_keys: int) -> None:
    if not drops:
        raise ValueError("dropout_keep is for a forward that drops (training, dropout > 0); this one does not")
    if keep.dtype != torch.bool or tuple(keep.shape) != (1, 1, num_queries, num_keys):
        raise ValueError(
            f"dropout_keep must be a bool tensor of shape (1, 1, queries={num_queries}, keys={num_keys}), "
            f"got dtype {keep.dtype} shape {tuple(keep.shape)}"
        )


def _check_key_mask(name: str, mask_BxK: Tensor, batch: int, num_keys: int, meaning: str) -> None:
    if mask_BxK.dtype != torch.bool or tuple(mask_BxK.shape) != (batch, num_keys):
        raise ValueError(
            f"{name} must be a bool tensor of shape (batch={batch}, keys={num_keys}) with {meaning}, "
            f"got dtype {mask_BxK.dtype} shape {tuple(mask_BxK.shape)}"
        )


def _from_key_padding_mask(key_mask: Tensor | None, key_padding_mask: Tensor, batch: int, num_keys: int) -> Tensor:
    """``key_mask`` from the deprecated ``key_padding_mask`` (True at padded keys), with the warning."""
    warnings.warn(
        "Attention: key_padding_mask (True at padded keys) is deprecated; pass key_mask=~key_padding_mask "
        "(True at keys to attend, the convention of every other mask)",
        DeprecationWarning,
        stacklevel=_caller_stacklevel(),
    )
    if key_mask is not None:
        raise ValueError("give key_mask (True = attend) or the deprecated key_padding_mask (True = padded), not both")
    _check_key_mask("key_padding_mask", key_padding_mask, batch, num_keys, "True at padded keys")
    return ~key_padding_mask


def _head_dim(name: str, total: int | None, per_head: int | None, dim: int, num_heads: int) -> int:
    if total is not None and per_head is not None:
        raise ValueError(f"give either {name} (total, split over heads) or head_dim_{name[:-4]} (per head), not both")
    if per_head is not None:
        if per_head < 1:
            raise ValueError(f"head_dim_{name[:-4]} must be >= 1, got {per_head}")
        return per_head
    total = dim if total is None else total
    if total < 1 or total % num_heads:
        raise ValueError(
            f"{name}={total} must be a positive multiple of num_heads={num_heads} "
            f"(the paper's convention: {name} is the total width split over heads)"
        )
    return total // num_heads
