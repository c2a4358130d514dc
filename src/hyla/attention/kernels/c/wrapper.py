"""Fused HYLA (and softmax attention) on CPU: the wrapper of a small C kernel (``hyla_cpu.c`` beside this file),
forward and backward.

Each (batch, query) row computes its scores for all heads and keys, their normalization, the generated value
network and its output in cache-sized scratch, so no ``B x H x Q x K`` tensor is ever written; the
backward recomputes the row (as FlashAttention does) instead of storing it. q, k, v, the output and
the gradients are read and written in the strides the model has (``B x T x H x E`` memory viewed as
``B x H x T x E``), so no transpose is copied on the way in or out. On the 2-core machine, one
thread, this makes the SRAVEN paper model's HYLA step 0.79x softmax's.

The C file is compiled on first use with the system C compiler (``cc``/``gcc``/``clang`` with
OpenMP; ``HYLA_CC`` overrides) into ``~/.cache/hyla/kernels`` (``HYLA_CACHE_DIR`` overrides), keyed by
the source, the flags, the compiler and the CPU, and loaded through ctypes; no PyTorch headers, so
it builds in about a second. It is built for the CPU it runs on (``-march=native``); ``HYLA_CPU_MARCH``
names another target (e.g. ``x86-64-v3``). The kernel writes its vector sums itself (8 lanes, a fixed
order, no contracted multiply-adds under ``-std=c99``), so with ``phi`` relu or identity its results do not
depend on the target; the other phis call libm, whose results may. Without a
working compiler it is unavailable and ``backend="auto"`` uses
``hyla.attention.kernels.manual_backward`` instead.

Covers (``COVERAGE["fused_cpu"]`` in ``hyla.attention.kernels.coverage``) ``value_network`` ``hyper``
(HYLA's) and ``linear`` (standard multi-head attention's) with every ``normalization`` (softmax over a row's
keys with an exponential of its own: float32 within 2 ulp of ``exp``), every phi, float32 and float64, any
mask broadcastable to ``Bx1xQxK``, any bias broadcastable to ``1xHxQxK`` and attention dropout (a ``QxK``
keep-mask shared over batch and heads, as ``hyla.attention.functional.drop_pairs`` draws it); first-order
gradients;
the ops ``hyla::fused_cpu_attention`` and ``hyla::fused_cpu_attention_backward`` carry it through
autograd, ``torch.compile`` (opaque calls; the library is built while tracing if need be) and
``torch.vmap`` (R stacked runs are folded into the batch: one call; a per-run bias or mask goes run by
run).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hyla.attention.config import AttentionConfig
from hyla.attention.kernels.coverage import COVERAGE, covers_dtype, dtype_names, variant_unsupported_reason
from hyla.attention.kernels.errors import CpuKernelUnavailableError
from hyla.runtime import c_compiler, c_compiler_version, cache_dir, cpuinfo_field

SOURCE = Path(__file__).with_name("hyla_cpu.c")
BASE_FLAGS = (
    "-O3", "-fopenmp", "-shared", "-fPIC", "-std=c99",
    # the source vectorizes its sums itself (fixed order); these only let sqrt and the like inline
    "-fno-math-errno", "-fno-trapping-math",
)  # fmt: skip
#: the environment variable naming the ``-march`` target (default ``native``)
MARCH_ENV = "HYLA_CPU_MARCH"
PHI_IDS = {"relu": 0, "silu": 1, "gelu": 2, "sigmoid": 3, "tanh": 4, "identity": 5}
NORM_IDS = {"none": 0, "rms_head": 1, "softmax": 2}  # NORM_NONE, NORM_RMS, NORM_SOFTMAX in the C source
#: the C functions' suffix for each dtype of ``COVERAGE["fused_cpu"]`` (one compiled copy per C type)
DTYPES = {torch.float32: "f32", torch.float64: "f64"}


_LIBRARY: ctypes.CDLL | None = None
_LOAD_ERROR: str | None = None


_compiler = c_compiler  # a module global, so that tests can take the compiler away


def target_march() -> str:
    """The ``-march`` target the kernel is built for: ``HYLA_CPU_MARCH``, default ``native``."""
    return os.environ.get(MARCH_ENV, "").strip() or "native"


def source_digest() -> str:
    """The first 12 hex digits of the kernel source's SHA-256: which version of the kernel a run used."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def build_flags() -> tuple[str, ...]:
    """The compiler flags: ``BASE_FLAGS`` and the ``-march`` target (``target_march``)."""
    return ("-march=" + target_march(), *BASE_FLAGS)


def _cpu_signature() -> str:
    # the flags decide what -march=native may use
    return cpuinfo_field("flags") or platform.processor() or platform.machine()


def _compile(compiler: str, flags: tuple[str, ...], out_dir: Path) -> Path:
    objects = []
    for real, suffix in (("float", "f32"), ("double", "f64")):
        obj = out_dir / f"{suffix}.o"
        cmd = [compiler, *flags, "-c", f"-DREAL={real}", f"-DSUFFIX={suffix}", str(SOURCE), "-o", str(obj)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr.strip()[-2000:]}")
        objects.append(str(obj))
    built = out_dir / "lib.so"
    done = subprocess.run([compiler, *flags, *objects, "-lm", "-o", str(built)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"linking the CPU kernel failed:\n{done.stderr.strip()[-2000:]}")
    return built


def _build(compiler: str) -> Path:
    version = c_compiler_version(compiler)
    flags = build_flags()
    key = hashlib.sha256(
        "\n".join([SOURCE.read_text(), " ".join(flags), version, _cpu_signature()]).encode()
    ).hexdigest()[:16]
    cache = cache_dir("kernels")
    target = cache / f"hyla_cpu_{key}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # the one slow first call (tens of seconds on a small CPU): said, so that it is not taken for a hang
    print(f"hyla: compiling the C attention kernel for this CPU once, into {cache} ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        try:
            built = _compile(compiler, flags, Path(tmp))
        except RuntimeError:  # e.g. Apple clang has no OpenMP: one thread is still far better than none
            built = _compile(compiler, tuple(f for f in flags if f != "-fopenmp"), Path(tmp))
        os.replace(built, target)  # atomic: concurrent processes never load a half-written library
    return target


def load_library() -> ctypes.CDLL:
    """The compiled kernel (building it on first use); raises CpuKernelUnavailableError if it cannot."""
    global _LIBRARY, _LOAD_ERROR
    if _LIBRARY is not None:
        return _LIBRARY
    if _LOAD_ERROR is None:
        compiler = _compiler()
        if compiler is None:
            _LOAD_ERROR = "no C compiler found (cc, gcc or clang; or set HYLA_CC)"
        else:
            try:
                _LIBRARY = ctypes.CDLL(str(_build(compiler)))
                return _LIBRARY
            except (OSError, RuntimeError) as err:
                _LOAD_ERROR = f"building it failed: {err}"
    raise CpuKernelUnavailableError(f"the fused CPU kernel is unavailable: {_LOAD_ERROR}")


def fused_cpu_unsupported_reason(
    config: AttentionConfig,
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    mask_Bx1xQxK: Tensor | None = None,
    bias: Tensor | None = None,
) -> str | None:
    """None when ``fused_cpu_hypernetwork_attention`` can run this case, else why not."""
    reason = variant_unsupported_reason("fused_cpu", config)
    if reason is not None:
        return reason
    coverage = COVERAGE["fused_cpu"]
    tensors = (q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, mask_Bx1xQxK, bias)
    vmap_unsupported = not (coverage.vmap and HAS_VMAP_RULE) and not torch.compiler.is_compiling()
    if vmap_unsupported and any(t is not None and torch._C._functorch.is_batchedtensor(t) for t in tensors):
        return f"inside torch.vmap (torch {torch.__version__} has no vmap rules for custom ops)"
    devices = coverage.devices
    if devices is not None and any(t is not None and t.device.type not in devices for t in tensors):
        return "tensors not on the CPU"
    dtypes = {t.dtype for t in (q_BxHxQxE, k_BxHxKxE, v_BxHxKxD)}
    if len(dtypes) > 1 or not covers_dtype("fused_cpu", q_BxHxQxE.dtype):
        return f"dtype {sorted(str(d) for d in dtypes)} (covered: {dtype_names('fused_cpu')})"
    if bias is not None and bias.dim() > 3 and any(n != 1 for n in bias.shape[:-3]):
        return f"a bias that varies over the batch (shape {tuple(bias.shape)}; covered: broadcastable to 1xHxQxK)"
    return _library_problem() or None


def _assume_constant_result(fn: Any) -> Any:
    """What ``torch.compiler.assume_constant_result`` does to ``fn``, without its ``import torch._dynamo``: that
    import is half of the seconds of ``import hyla`` on a CPU, and every ``hyla`` command would pay it.
    ``tests/test_c_kernel.py`` checks that the mark is still the one torch's decorator sets."""
    fn._dynamo_marked_constant = True
    return fn


@_assume_constant_result  # torch.compile runs it once while tracing: building is no graph op
def _library_problem() -> str:
    """Why the kernel cannot be loaded ("" when it can), building it on first use."""
    try:
        load_library()
    except CpuKernelUnavailableError as err:
        return str(err)
    return ""


def _pointer(t: Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(None if t is None else t.data_ptr())


def _real(suffix: str) -> type:
    return ctypes.c_float if suffix == "f32" else ctypes.c_double


def _strides(t: Tensor) -> Any:
    return (ctypes.c_longlong * 4)(*t.stride())


def _call_c(
    direction: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    drop: Tensor | None,
    keep_prob: float,
    phi: int,
    norm: int,
    linear: bool,
    eps: float,
    threads: int,
    *buffers: Tensor | None,
) -> None:
    """``hyla_{direction}_{f32|f64}`` of ``hyla_cpu.c``: the inputs and settings both directions take, then
    ``buffers`` (forward: ``y``; backward: ``dy``, ``dq``, ``dk``, ``dv``, then ``dbias`` or None), each
    4-d one passed with its strides."""
    lib, suffix = load_library(), DTYPES[q.dtype]
    real = _real(suffix)
    keep_batched = int(keep is not None and keep.shape[0] > 1)
    b, h, nq, e = q.shape
    sizes = [ctypes.c_int(n) for n in (b, h, nq, k.shape[2], e, v.shape[3])]
    tail: list[Any] = []
    for t in buffers:
        tail.append(_pointer(t))
        if t is not None and t.dim() == 4:
            tail.append(_strides(t))
    failed = getattr(lib, f"hyla_{direction}_{suffix}")(
        _pointer(q), _strides(q), _pointer(k), _strides(k), _pointer(v), _strides(v), _pointer(bias),
        _pointer(keep), ctypes.c_int(keep_batched), _pointer(drop), real(keep_prob), *sizes,
        real(1.0 / e**0.5), ctypes.c_int(norm), ctypes.c_int(int(linear)), real(eps), ctypes.c_int(phi),
        ctypes.c_int(threads), *tail,
    )  # fmt: skip
    if failed:
        raise MemoryError("hyla fused CPU kernel: could not allocate its scratch")


def _output_like_heads_inside(b: int, h: int, t: int, d: int, like: Tensor) -> Tensor:
    """A fresh ``B x H x T x D`` tensor laid out as ``B x T x H x D`` in memory: the layout the model's
    output projection reads without a copy."""
    return torch.empty_strided((b, h, t, d), (t * h * d, d, h * d, 1), dtype=like.dtype, device=like.device)


# The kernel is registered as PyTorch custom ops (opaque to torch.compile, which traces the layout
# changes around them and calls the C code as is), with the backward as an op of its own.
@torch.library.custom_op("hyla::fused_cpu_attention", mutates_args=(), device_types="cpu")
def _fused_cpu_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    drop: Tensor | None,
    keep_prob: float,
    phi: int,
    norm: int,
    linear: bool,
    eps: float,
) -> Tensor:
    b, h, nq, _ = q.shape
    y = _output_like_heads_inside(b, h, nq, v.shape[3], q)
    _call_c("forward", q, k, v, bias, keep, drop, keep_prob, phi, norm, linear, eps, torch.get_num_threads(), y)
    return y


@_fused_cpu_attention.register_fake
def _fused_cpu_attention_fake(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    drop: Tensor | None,
    keep_prob: float,
    phi: int,
    norm: int,
    linear: bool,
    eps: float,
) -> Tensor:
    return _output_like_heads_inside(q.shape[0], q.shape[1], q.shape[2], v.shape[3], q)


@torch.library.custom_op("hyla::fused_cpu_attention_backward", mutates_args=(), device_types="cpu")
def _fused_cpu_attention_backward(
    dy: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    drop: Tensor | None,
    keep_prob: float,
    phi: int,
    norm: int,
    linear: bool,
    eps: float,
    bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbias = torch.empty_like(bias) if bias is not None and bias_grad else None
    threads = torch.get_num_threads()
    _call_c("backward", q, k, v, bias, keep, drop, keep_prob, phi, norm, linear, eps, threads, dy, dq, dk, dv, dbias)
    return dq, dk, dv, (dbias if dbias is not None else q.new_empty(0))


@_fused_cpu_attention_backward.register_fake
def _fused_cpu_attention_backward_fake(
    dy: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    drop: Tensor | None,
    keep_prob: float,
    phi: int,
    norm: int,
    linear: bool,
    eps: float,
    bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dbias = torch.empty_like(bias) if bias is not None and bias_grad else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    q, k, v, bias, keep, drop, keep_prob, phi, norm, linear, eps = inputs
    ctx.save_for_backward(q, k, v, bias, keep, drop)
    ctx.keep_prob, ctx.phi, ctx.norm, ctx.linear, ctx.eps = keep_prob, phi, norm, linear, eps


def _backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
    q, k, v, bias, keep, drop = ctx.saved_tensors
    bias_grad = bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias = _fused_cpu_attention_backward(
        dy, q, k, v, bias, keep, drop, ctx.keep_prob, ctx.phi, ctx.norm, ctx.linear, ctx.eps, bias_grad
    )
    return dq, dk, dv, (dbias if bias_grad else None), None, None, None, None, None, None, None


_fused_cpu_attention.register_autograd(_backward, setup_context=_setup_context)


def _slice_by_slice(op: Any, in_dims: tuple[int | None, ...], args: tuple[Any, ...]) -> tuple[Any, Any]:
    """``op`` once per index of the vmapped dimension (always correct, no folding)."""
    size = next(a.shape[d] for a, d in zip(args, in_dims) if d is not None)
    outs = [op(*(a.select(d, i) if d is not None else a for a, d in zip(args, in_dims))) for i in range(size)]
    if isinstance(outs[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*outs)), tuple(0 for _ in outs[0])
    return torch.stack(outs), 0


def _fused_cpu_attention_vmap(info: Any, in_dims: tuple[int | None, ...], *args: Any) -> tuple[Tensor, int]:
    """Stacked runs (``R`` models under ``torch.vmap``): the runs are folded into the batch, one call."""
    q, k, v, bias, keep, drop, keep_prob, phi, norm, linear, eps = args
    if any(d is not None for d in in_dims[3:6]):  # per-run bias, mask or dropout: the kernel takes one
        return _slice_by_slice(_fused_cpu_attention, in_dims, args)
    runs = info.batch_size
    q, k, v = (t.movedim(d, 0) if d is not None else t.expand(runs, *t.shape) for t, d in zip((q, k, v), in_dims[:3]))
    q, k, v = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
    if keep is not None and keep.shape[0] > 1:  # one mask per example: repeat it for every run
        keep = keep.repeat(runs, 1, 1)
    y = _fused_cpu_attention(q, k, v, bias, keep, drop, keep_prob, phi, norm, linear, eps)
    return y.reshape(runs, -1, *y.shape[1:]), 0


def _fused_cpu_attention_backward_vmap(
    info: Any, in_dims: tuple[int | None, ...], *args: Any
) -> tuple[tuple[Tensor, ...], tuple[int, ...]]:
    return _slice_by_slice(_fused_cpu_attention_backward, in_dims, args)


HAS_VMAP_RULE = hasattr(_fused_cpu_attention, "register_vmap")  # custom-op vmap rules: recent torch
if HAS_VMAP_RULE:
    _fused_cpu_attention.register_vmap(_fused_cpu_attention_vmap)
    _fused_cpu_attention_backward.register_vmap(_fused_cpu_attention_backward_vmap)


def fused_cpu_hypernetwork_attention(
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    config: AttentionConfig,
    *,
    mask_Bx1xQxK: Tensor | None = None,
    bias: Tensor | None = None,
    dropout_keep_11xQxK: Tensor | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """``y_BxHxQxD`` of ``hypernetwork_attention`` by the fused CPU kernel.

    ``mask_Bx1xQxK`` is bool broadcastable to ``Bx1xQxK`` (True = may attend); ``bias`` broadcastable to
    ``1xHxQxK`` (its gradient is summed back to its shape). ``dropout_keep_11xQxK`` (bool, True = kept) with
    rate ``dropout``: attention dropout on the normalized code, as
    ``drop_pairs`` applies it. Raises ``CpuKernelUnavailableError``
    naming the cause for a case it does not cover (``fused_cpu_unsupported_reason``).
    """
    reason = fused_cpu_unsupported_reason(config, q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, mask_Bx1xQxK, bias)
    if reason is not None:
        raise CpuKernelUnavailableError(f"backend='fused_cpu' cannot run this case: {reason}")
    dtype = q_BxHxQxE.dtype
    h, nq, nk = q_BxHxQxE.shape[1], q_BxHxQxE.shape[2], k_BxHxKxE.shape[2]
    keep = None
    if mask_Bx1xQxK is not None:  # (1 or B) x Q x K bytes
        mask4 = mask_Bx1xQxK.reshape((1,) * (4 - mask_Bx1xQxK.dim()) + tuple(mask_Bx1xQxK.shape))
        keep = mask4.expand(mask4.shape[0], 1, nq, nk).reshape(-1, nq, nk).to(torch.uint8).contiguous()
    bias_HxQxK = None
    if bias is not None:
        bias_HxQxK = bias.to(dtype).expand(*bias.shape[:-3], h, nq, nk).reshape(h, nq, nk).contiguous()
    drop = None
    if dropout_keep_11xQxK is not None:  # Q x K bytes
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if dropout_keep_11xQxK.numel() != nq * nk:
            raise ValueError(
                f"dropout_keep_11xQxK must hold one entry per (query, key) pair, 1x1x{nq}x{nk}; "
                f"got shape {tuple(dropout_keep_11xQxK.shape)}"
            )
        drop = dropout_keep_11xQxK.reshape(nq, nk).to(torch.uint8).contiguous()
    return _fused_cpu_attention(
        q_BxHxQxE,
        k_BxHxKxE,
        v_BxHxKxD,
        bias_HxQxK,
        keep,
        drop,
        1.0 - dropout,
        PHI_IDS[config.nonlinearity],
        NORM_IDS[config.normalization],
        config.value_network == "linear",
        config.rms_eps,
    )
