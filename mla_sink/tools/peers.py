"""Benchmark peers: FlashMLA's sparse kernels called on mla-sink's data (``mla-sink bench``, ``--host``).

FlashMLA (deepseek-ai/FlashMLA, MIT) is a benchmark peer only: never a dependency, never vendored.
``../shared/peers/README.md`` says how to build it; ``import flash_mla`` must work for these adapters
to run. Its API at the commit the README names (``flash_mla/flash_mla_interface.py``):

* ``flash_mla_sparse_fwd(q [T, H, 576] bf16, kv [N, 1, 576] bf16, indices [T, 1, topk] int32, sm_scale,
  512, attn_sink [H] fp32 | None)`` -> ``(out [T, H, 512] bf16, max_logits [T, H], lse [T, H])``: its sm90
  sparse prefill kernel, which engines call for decode with tokens = batch * s_q. Ids ``-1`` or ``>= N``
  are skipped. Head counts: 64 and 128 only (``csrc/api/sparse_fwd.h``: "Unsupported h_q").
* ``flash_mla_with_kvcache(q [T, 1, H, 576] bf16, k_cache [blocks, 64, 1, 656] uint8, None, None, 512,
  sched, None, sm_scale, False, True, indices=[T, 1, topk] int32, attn_sink=[H] fp32)`` with
  ``sched, _ = get_mla_metadata()`` -> ``(out [T, 1, H, 512] bf16, lse [T, H, 1])``: its sparse FP8
  decode on the 656-byte V3.2 rows (512 e4m3 values, 4 fp32 scales, 64 bf16 RoPE values); ids are global
  rows ``block * 64 + offset``, ``-1`` skipped. Head counts: 64 and 128 only (``csrc/api/sparse_decode.h``);
  it crashes at 16 heads, so it is never called at other head counts.

LSE convention (read from the sources at that commit, and checked against our float64 reference by
:func:`peer_checks`): both kernels return the **natural-log** LSE (the kernels work in log2 and divide
by ``log2(e)`` on the way out: ``csrc/sm90/prefill/sparse/phase1.cuh`` writes ``log(L) + M * ln 2``,
``csrc/smxx/decode/combine/combine.cu`` writes ``global_lse / M_LOG2E``) **without the sink** (the sink
only rescales ``out``; the combine kernel adds it after writing the LSE), the same as ours; a row with no
valid id gets ``+inf`` where ours gets ``-inf`` (``tests/ref.py``: "lonely q"), which
:func:`lse_to_ours` maps.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, Callable, NamedTuple, Optional

import torch

from mla_sink.core.kv_layout import LAYOUT, ROW_BYTES, quantize_kv_cache
from mla_sink.core.records import D_QK, D_V
from mla_sink.core.tables import load_checked_table

#: rows of one page block of FlashMLA's decode cache (its tests and vLLM use 64)
FLASH_MLA_BLOCK = 64
#: the names peers are recorded under in a case's ``impls``
SPARSE_FWD, DECODE = "flash_mla_sparse_fwd", "flash_mla_decode"
LSE_CONVENTION = ("FlashMLA's returned lse is natural-log and sink-free, as ours (the kernels divide their "
                  "log2 value by log2(e); the sink only rescales out); a row with no valid id gives +inf where "
                  "ours gives -inf, mapped before comparing")


class PeerCall(NamedTuple):
    """One peer call prepared on fixed tensors.

    ``run()`` is the peer's call alone (what the bench times; no conversion inside); ``result(run())``
    converts its return value to ours: ``(out [T, H, 512] bf16, lse [T, H] fp32)``, natural log, sink
    excluded, ``-inf`` on rows with no valid id.
    """

    run: Callable[[], Any]
    result: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]


def import_flash_mla() -> tuple[Optional[Any], str]:
    """``(flash_mla module, "")`` when ``import flash_mla`` works, else ``(None, why)``."""
    try:
        import flash_mla  # type: ignore
    except Exception as e:  # ImportError, or a broken build (missing CUDA library): no peer
        return None, f"flash_mla not importable: {type(e).__name__}: {e}"[:300]
    return flash_mla, ""


def flash_mla_unless_off(peers_flag: Optional[bool]) -> tuple[Optional[Any], str]:
    """:func:`import_flash_mla`, or ``(None, "off (--no-peers)")`` where the benchmarks' ``--no-peers`` gave
    ``peers_flag=False`` (``None``: left out, ``True``: ``--peers``; both import)."""
    return (None, "off (--no-peers)") if peers_flag is False else import_flash_mla()


@functools.cache
def peers_table():
    """``tables/peers.yaml`` (at which shapes each peer is called) as a checked :class:`dispatch.RuleTable`
    (cached).

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped table is malformed, has a gap or a shadowed row.
    """
    return load_checked_table("peers", paths=("call",))


def skip_reason(peer: str, num_heads: int) -> Optional[str]:
    """Why ``peer`` (:data:`SPARSE_FWD` or :data:`DECODE`) is not called at ``num_heads`` (the refusal row of
    ``tables/peers.yaml`` that matches, with the count), or None where it is called. Cached per pair.

    Raises:
        ValueError: ``peer`` is not a peer name the table declares, or ``num_heads`` not an int >= 1.
    """
    if not isinstance(peer, str):
        raise ValueError(f"'peer' must be a peer name, {SPARSE_FWD!r} or {DECODE!r} (got {peer!r})")
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1:
        raise ValueError(f"'num_heads' must be an int >= 1 (got {num_heads!r})")
    return _skip_reason(peer, int(num_heads))


@functools.cache
def _skip_reason(peer: str, num_heads: int) -> Optional[str]:
    sel = peers_table().select({"peer": peer, "num_heads": num_heads})
    return f"{sel.reason}; not called at {num_heads}" if sel.refused else None


def peer_heads(peer: str) -> tuple:
    """The head counts of ``tables/peers.yaml``'s ``num_heads`` domain at which ``peer`` is called.

    Raises:
        ValueError: ``peer`` is not a peer name the table declares.
    """
    return tuple(h for h in peers_table().fields["num_heads"].domain if skip_reason(peer, h) is None)


def lse_to_ours(lse: torch.Tensor) -> torch.Tensor:
    """FlashMLA's LSE (natural log, sink excluded, ``+inf`` on rows with no valid id) as ours: fp32,
    ``-inf`` on those rows. A finite or NaN value passes unchanged."""
    lse = lse.float()
    return torch.where(torch.isposinf(lse), torch.full_like(lse, float("-inf")), lse)


def _peer_ids(indices: torch.Tensor, num_rows: int) -> torch.Tensor:
    """int32 ``[T, topk]``: our ids with every invalid one (negative or ``>= num_rows``) as ``-1``, the
    skip marker both kernels take (out-of-range ids would be read by the decode kernel)."""
    valid = (indices >= 0) & (indices < num_rows)
    return torch.where(valid, indices, torch.full_like(indices, -1)).to(torch.int32).contiguous()


def sparse_fwd_call(flash_mla: Any, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                    sinks: Optional[torch.Tensor], sm_scale: float) -> PeerCall:
    """``flash_mla_sparse_fwd`` on our call's tensors (tokens = T, the batch of a decode step).

    Args:
        flash_mla: the imported module (:func:`import_flash_mla`).
        q: bf16 ``[T, H, 576]``, innermost stride 1; H one FlashMLA serves (:func:`skip_reason`).
        kv_cache: bf16 ``[N, 576]``, innermost stride 1 (passed as the view ``[N, 1, 576]``).
        indices: int32 ``[T, topk]``; invalid ids are given as ``-1``.
        sinks: optional fp32 ``[H]`` (passed as ``attn_sink``: the same work as ours), or None.
        sm_scale: multiplies ``q.k``.

    Raises:
        ValueError: ``q`` is not ``[T, H, 576]`` with H one FlashMLA serves (:func:`skip_reason`) or
            ``kv_cache`` not ``[N, 576]``.
    """
    T, H = _check_q(q)
    if kv_cache.dim() != 2 or kv_cache.shape[1] != D_QK:
        raise ValueError(f"'kv_cache' must be [N, {D_QK}] for {SPARSE_FWD} (got {tuple(kv_cache.shape)})")
    kv3 = kv_cache.unsqueeze(1)
    idx3 = _peer_ids(indices, kv_cache.shape[0]).unsqueeze(1)
    sink = None if sinks is None else sinks.float().contiguous()

    def run():
        return flash_mla.flash_mla_sparse_fwd(q, kv3, idx3, sm_scale, D_V, sink)

    def result(ret):
        out, _max_logits, lse = ret
        return out.reshape(T, H, D_V), lse_to_ours(lse.reshape(T, H))

    return PeerCall(run, result)


def decode_call(flash_mla: Any, q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor,
                sinks: Optional[torch.Tensor], sm_scale: float) -> PeerCall:
    """``flash_mla_with_kvcache`` (sparse, ``is_fp8_kvcache=True``) on a 656-byte V3.2 cache.

    The scheduler metadata (``get_mla_metadata``) is filled by one call made here, outside any CUDA-graph
    capture, and reused by every later call (the shapes stay the same).

    Args:
        flash_mla: the imported module (:func:`import_flash_mla`).
        q: bf16 ``[T, H, 576]``, innermost stride 1; H one FlashMLA serves (:func:`skip_reason`; never called
            at others).
        cache: uint8 ``[n, 656]`` contiguous, n a multiple of :data:`FLASH_MLA_BLOCK` (:func:`ds_mla_cache`);
            passed as the view ``[n / 64, 64, 1, 656]``, so ids are our row numbers.
        indices: int32 ``[T, topk]``; invalid ids (negative, ``>= n``) are given as ``-1``.
        sinks: optional fp32 ``[H]`` (``attn_sink``).
        sm_scale: multiplies ``q.k``.

    Raises:
        ValueError: a shape, dtype or head count above is not met (checked before FlashMLA is called).
    """
    T, H = _check_q(q)
    if skip_reason(DECODE, H) is not None:
        raise ValueError(f"'q' has {H} heads: {skip_reason(DECODE, H)}")
    n = _check_cache(cache)
    cache4 = cache.view(n // FLASH_MLA_BLOCK, FLASH_MLA_BLOCK, 1, ROW_BYTES)
    q4 = q.unsqueeze(1)
    idx3 = _peer_ids(indices, n).unsqueeze(1)
    sink = None if sinks is None else sinks.float().contiguous()
    sched, _ = flash_mla.get_mla_metadata()

    def run():
        return flash_mla.flash_mla_with_kvcache(q4, cache4, None, None, D_V, sched, None, sm_scale, False, True,
                                                indices=idx3, attn_sink=sink)

    def result(ret):
        out, lse = ret
        return out.reshape(T, H, D_V), lse_to_ours(lse.reshape(T, H))

    run()
    return PeerCall(run, result)


def _check_q(q: torch.Tensor) -> tuple[int, int]:
    if q.dim() != 3 or q.shape[2] != D_QK or q.stride(2) != 1:  # the dtype (bf16) FlashMLA checks itself
        raise ValueError(f"'q' must be [T, H, {D_QK}] with innermost stride 1 for FlashMLA (got {tuple(q.shape)})")
    return q.shape[0], q.shape[1]


def _check_cache(cache: torch.Tensor) -> int:
    n = cache.shape[0] if cache.dim() == 2 else -1
    if (cache.dtype != torch.uint8 or cache.dim() != 2 or cache.shape[1] != ROW_BYTES
            or not cache.is_contiguous() or n <= 0 or n % FLASH_MLA_BLOCK):
        raise ValueError(f"'cache' must be a contiguous uint8 [n, {ROW_BYTES}] with n a positive multiple "
                         f"of {FLASH_MLA_BLOCK} (got {cache.dtype} {tuple(cache.shape)})")
    return n


def ds_mla_rows(num_rows: int) -> int:
    """Rows of the 656-byte cache built from a pool of ``num_rows``: whole blocks of
    :data:`FLASH_MLA_BLOCK` (0 when the pool is smaller than one block)."""
    return num_rows // FLASH_MLA_BLOCK * FLASH_MLA_BLOCK


def ds_mla_source(scale: str = "pow2") -> str:
    """Which quantiser writes the cache of :func:`ds_mla_cache` with tile scales of convention ``scale`` (the
    bench's JSON records it)."""
    return f"mla_sink.quantize_kv_cache(layout={LAYOUT!r}, scale={scale!r})"


#: which quantiser writes the cache of :func:`ds_mla_cache` by default
DS_MLA_SOURCE = ds_mla_source("pow2")


def ds_mla_cache(kv: torch.Tensor, scale: str = "pow2") -> tuple[torch.Tensor, str]:
    """The 656-byte V3.2 FP8 cache of the first :func:`ds_mla_rows` rows of a bf16 pool, written by
    :func:`mla_sink.quantize_kv_cache` with tile scales of convention ``scale``: ``"pow2"`` (FlashMLA's quantiser,
    the default) or ``"amax"`` (``amax / 448``, vLLM's writer; FlashMLA's sm90 decode rounds such scales to bf16,
    mla-sink reads them as the float32 they are).

    Args:
        kv: bf16 ``[N, 576]``, N >= 64.
        scale: ``"pow2"`` or ``"amax"`` (``mla_sink.core.kv_layout.SCALE_CONVENTIONS``).

    Returns:
        ``(cache, source)``: uint8 ``[n, 656]`` contiguous (n = :func:`ds_mla_rows` of N) and
        :func:`ds_mla_source` of ``scale`` (which quantiser wrote it).

    Raises:
        ValueError: the pool has fewer than 64 rows, ``scale`` is not a convention, or ``kv`` is not one
            :func:`mla_sink.quantize_kv_cache` takes.
    """
    n = ds_mla_rows(kv.shape[0])
    if n == 0:
        raise ValueError(f"'kv' has {kv.shape[0]} rows; the {ROW_BYTES}-byte cache needs at least "
                         f"{FLASH_MLA_BLOCK} (one page block)")
    return quantize_kv_cache(kv[:n], layout=LAYOUT, scale=scale).contiguous(), ds_mla_source(scale)


# ---------------------------------------------------------------- correctness on one small case
#: the small case the peers are checked on against the float64 reference (tokens, heads, topk, pool rows)
#: (``H`` None: the smallest head count both peers serve, read from tables/peers.yaml per check)
CHECK_SHAPE = dict(T=2, H=None, topk=256, pool_rows=4 * FLASH_MLA_BLOCK * FLASH_MLA_BLOCK)


def errors(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor) -> dict:
    """Max abs and max relative error of ``out`` and ``lse`` against the reference.

    ``max_abs_err_*`` = ``max |a - b|`` (equal infinities count 0, a NaN gives NaN);
    ``max_rel_err_*`` = ``max_abs_err / max |b|`` over the finite reference values (relative to the
    largest reference magnitude, so values near 0 do not blow it up).
    """
    doc = {}
    for name, a, b in (("out", out, ref_out), ("lse", lse, ref_lse)):
        a, b = a.to(torch.float64).cpu(), b.to(torch.float64).cpu()
        diff = torch.where(a == b, torch.zeros_like(a), (a - b).abs())
        finite = b[torch.isfinite(b)]
        abs_err = float(diff.max()) if diff.numel() else 0.0
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        doc[f"max_abs_err_{name}"] = abs_err
        doc[f"max_rel_err_{name}"] = abs_err / scale if scale > 0 else abs_err
    return doc


def peer_checks(flash_mla: Any, device: Any, *, seed: int = 1) -> dict:
    """Each FlashMLA kernel against our float64 reference on one small case with sinks (:data:`CHECK_SHAPE`,
    a few ``-1`` ids): ``flash_mla_sparse_fwd`` on the bf16 pool, the fp8 decode on the 656-byte cache of
    that pool (the reference reads that uint8 cache itself: its exact float64 values,
    :func:`mla_sink.dequantize_kv_cache`).

    Returns:
        ``{"shape": CHECK_SHAPE, "lse_convention": str, "flash_mla_sparse_fwd": {errors...},
        "flash_mla_decode": {errors..., "cache": quantiser}}``; a peer that fails gets ``{"error": str}``.
        Error fields: :func:`errors`.
    """
    from mla_sink.core.reference import sparse_mla_decode_reference

    shape = dict(CHECK_SHAPE)
    if shape["H"] is None:  # the smallest head count both peers serve (tables/peers.yaml)
        shape["H"] = min(set(peer_heads(SPARSE_FWD)) & set(peer_heads(DECODE)))
    T, H, topk, rows = shape["T"], shape["H"], shape["topk"], shape["pool_rows"]
    gen = torch.Generator(device=device).manual_seed(seed)
    kv = torch.randn(rows, D_QK, device=device, generator=gen).to(torch.bfloat16)
    q = torch.randn(T, H, D_QK, device=device, generator=gen).to(torch.bfloat16)
    idx = torch.randint(0, rows, (T, topk), device=device, generator=gen, dtype=torch.int32)
    idx[:, ::17] = -1  # skipped ids, anywhere in a row
    sinks = torch.randn(H, device=device, generator=gen).float()
    sm_scale = D_QK ** -0.5
    doc: dict = {"shape": shape, "sinks": True, "sm_scale": sm_scale, "lse_convention": LSE_CONVENTION}
    try:
        ref_out, ref_lse = sparse_mla_decode_reference(q, kv, idx, sinks, sm_scale)
        call = sparse_fwd_call(flash_mla, q, kv, idx, sinks, sm_scale)
        doc[SPARSE_FWD] = errors(*call.result(call.run()), ref_out, ref_lse)
    except Exception as e:  # a peer that fails is reported, not fatal
        doc[SPARSE_FWD] = {"error": repr(e)[:300]}
    try:
        cache, source = ds_mla_cache(kv)
        ref_out, ref_lse = sparse_mla_decode_reference(q, cache, idx, sinks, sm_scale)
        call = decode_call(flash_mla, q, cache, idx, sinks, sm_scale)
        doc[DECODE] = dict(errors(*call.result(call.run()), ref_out, ref_lse), cache=source)
    except Exception as e:
        doc[DECODE] = {"error": repr(e)[:300]}
    return doc
