"""Launch parameters of the Triton decode kernel, looked up in ``tables/triton_tuning.yaml``.

The table is a rule table in the project's generic format (ordered rows, first match wins, single
path ``triton``); :func:`triton_config` is the only lookup, through
``dispatch.load_table`` (:func:`_select`). No arch-specific branches live in code.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import attrs

from mla_sink.core.tables import table_path


@attrs.frozen
class TritonConfig:
    """Launch parameters of :func:`mla_sink.paths.triton.launch.sparse_mla_decode_triton`.

    Attributes:
        block_h: head block (a power of two >= 16); clamped per call by :meth:`block_h_for`.
        block_n: ids gathered per loop step (a power of two >= 16).
        num_warps, num_stages: Triton launch options.
        max_kv_splits: upper bound on KV splits per token.
        min_ids_per_split: lower bound on ids per split.
        split_waves: target programs per SM when splitting.
        split_min_fill: split only when the unsplit grid has fewer than this fraction of the SMs' programs.
        combine_block_h: head block of the combine kernel.
        combine_block_d: value columns per combine program (a power of two dividing 512).
        fp8_f16: with fp8 KV, compute in fp16 tiles (one-instruction fp8 -> fp16 conversion; bf16 q is
            scaled per head row by a power of two to fit fp16) instead of bf16 tiles.
        fp8_bits: with ``fp8_f16`` and e4m3fn KV, decode by integer bit placement instead of ``cvt``.
        kernel: ``"portable"`` (:mod:`mla_sink.paths.triton.launch`, every target and the CPU),
            ``"gluon_ws"`` (:mod:`mla_sink.kernels.gluon.gluon_ws`, the warp-specialised sm90 kernel for
            64-head blocks) or ``"gluon_fp8"`` (:mod:`mla_sink.kernels.gluon.gluon_fp8`, the sm90
            kernel for fp8 KV at H <= 16), each taken only where :func:`kernel_for` allows it and the
            portable kernel otherwise.
        row: id of the table row that produced it (``"explicit"`` when built by hand).
    """

    block_h: int = 64
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2
    max_kv_splits: int = 32
    min_ids_per_split: int = 64
    split_waves: float = 1.0
    split_min_fill: float = 0.5
    combine_block_h: int = 16
    combine_block_d: int = 512
    fp8_f16: bool = True
    fp8_bits: bool = False
    kernel: str = attrs.field(default="portable", validator=attrs.validators.in_(("portable", "gluon_ws", "gluon_fp8")))
    row: str = "explicit"

    def block_h_for(self, num_heads: int) -> int:
        """Head block for ``num_heads`` heads: ``min(block_h, max(16, next_pow2(num_heads)))``."""
        return min(self.block_h, max(16, 1 << max(0, (num_heads - 1).bit_length())))


_PARAM_NAMES = {
    "BLOCK_H": "block_h", "BLOCK_N": "block_n", "num_warps": "num_warps", "num_stages": "num_stages",
    "max_kv_splits": "max_kv_splits", "min_ids_per_split": "min_ids_per_split",
    "split_waves": "split_waves", "split_min_fill": "split_min_fill", "combine_block_h": "combine_block_h",
    "combine_block_d": "combine_block_d", "fp8_f16": "fp8_f16", "fp8_bits": "fp8_bits", "kernel": "kernel",
}


@functools.lru_cache(maxsize=None)
def _table():
    from mla_sink import dispatch

    return dispatch.load_table(table_path("triton_tuning"))


def _select(values: dict) -> tuple[str, dict]:
    """(row id, params) of the first matching row of the tuning table (``dispatch`` rule engine)."""
    table = _table()
    sel = table.select({k: v for k, v in values.items() if k in table.fields})
    if sel.row is None or sel.path is None:
        from mla_sink import dispatch

        raise LookupError(f"no row of the Triton tuning table serves {values}:\n{dispatch.explain(sel)}")
    return sel.row.id, dict(sel.params)


@functools.lru_cache(maxsize=None)
def triton_config(arch: str, q_dtype: str, kv_dtype: str, num_heads: int, num_tokens: int, topk: int) -> TritonConfig:
    """Launch parameters for one call shape, from ``tables/triton_tuning.yaml``.

    Args:
        arch: compile target (``sm90``, ``gfx942``, ``cpu``, ...).
        q_dtype, kv_dtype: dtype keys (``bf16``, ``fp16``, ``fp8_e4m3``, ``fp8_e4m3fnuz``).
        num_heads: H. num_tokens: T. topk: ids per token.

    Raises:
        LookupError: no row matches (the table's last row should catch every GPU).
    """
    row_id, params = _select({"arch": arch, "q_dtype": q_dtype, "kv_dtype": kv_dtype,
                              "num_heads": num_heads, "num_tokens": num_tokens, "topk": topk})
    return TritonConfig(row=row_id, **{_PARAM_NAMES[k]: v for k, v in params.items()})


def num_kv_splits_for(cfg: TritonConfig, num_tokens: int, num_head_blocks: int, topk: int, num_sms: int) -> int:
    """KV splits per token: 1 when ``T * head blocks`` fills the GPU, else enough to reach ``split_waves``.

    A pure function of shapes and the SM count (no device data), so it is safe under CUDA-graph capture.
    """
    programs = max(1, num_tokens * num_head_blocks)
    if programs >= cfg.split_min_fill * num_sms:
        return 1
    want = math.ceil(cfg.split_waves * num_sms / programs)
    most = max(1, math.ceil(topk / cfg.min_ids_per_split))
    return max(1, min(want, cfg.max_kv_splits, most))


def split_plan(cfg: TritonConfig, num_tokens: int, num_heads: int, topk: int, num_sms: int,
               requested: int | None = None) -> tuple[int, int]:
    """``(num_kv_splits, ids_per_split)`` of a launch: ``requested`` splits (default
    :func:`num_kv_splits_for`), at most one per ``block_n`` ids, rounded so every split but the last
    holds a whole number of ``block_n`` blocks. Pure."""
    if requested is None:
        requested = num_kv_splits_for(cfg, num_tokens, -(-num_heads // cfg.block_h_for(num_heads)), topk, num_sms)
    ids = max(topk, 1)
    splits = max(1, min(int(requested), -(-ids // cfg.block_n)))
    ids_per_split = -(-(-(-ids // splits)) // cfg.block_n) * cfg.block_n
    return -(-ids // ids_per_split), ids_per_split


def kernel_for(cfg: TritonConfig, *, device_type: str, q_dtype: str, kv_dtype: str, num_heads: int,
               num_kv_splits: int, logit_cap: float, gluon_ok: bool) -> str:
    """Which kernel serves a launch: ``cfg.kernel`` where its conditions hold, else ``"portable"``.

    Both Gluon kernels need a CUDA device, Triton's Gluon dialect (``gluon_ok``), no soft cap and no
    split-KV (the grid fills the GPU). ``"gluon_ws"`` covers bf16 or fp16 q and KV of one dtype in
    64-head blocks (H > 32); ``"gluon_fp8"`` covers e4m3fn KV with bf16 or fp16 q at H <= 16.
    Everything else runs the portable kernel. Pure: safe to call under CUDA-graph capture and
    testable on the CPU.
    """
    if cfg.kernel == "portable" or not (gluon_ok and device_type == "cuda" and num_kv_splits == 1
                                         and not logit_cap > 0):
        return "portable"
    if cfg.kernel == "gluon_ws":
        ok = q_dtype == kv_dtype and q_dtype in ("bf16", "fp16") and cfg.block_h_for(num_heads) == 64
    else:  # gluon_fp8
        ok = kv_dtype == "fp8_e4m3" and q_dtype in ("bf16", "fp16") and num_heads <= 16
    return cfg.kernel if ok else "portable"


def describe_launch(arch: str, q_dtype: str, kv_dtype: str, num_heads: int, num_tokens: int, topk: int, *,
                    num_sms: int | None = None, logit_cap: float = 0.0, gluon_ok: bool = True) -> dict:
    """How the ``triton`` path would launch a call: tuning row, its parameters and why, split count and
    kernel (where ``num_sms`` is known). Pure; used by ``mla-sink explain``.

    Returns:
        ``{"row", "params", "why", "source", "block_h", "num_kv_splits", "kernel"}``; the last two are
        ``None`` when ``num_sms`` is ``None`` (they depend on the SM count).
    """
    cfg = triton_config(arch, q_dtype, kv_dtype, num_heads, num_tokens, topk)
    row = next(r for r in _table().rows if r.id == cfg.row)
    block_h = cfg.block_h_for(num_heads)
    splits = kernel = None
    if num_sms is not None:
        splits, _ = split_plan(cfg, num_tokens, num_heads, topk, num_sms)
        kernel = kernel_for(cfg, device_type="cpu" if arch == "cpu" else "cuda", q_dtype=q_dtype,
                            kv_dtype=kv_dtype, num_heads=num_heads, num_kv_splits=splits, logit_cap=logit_cap,
                            gluon_ok=gluon_ok)
    return dict(row=cfg.row, params=dict(row.params), why=row.why, source=row.source, block_h=block_h,
                num_kv_splits=splits, kernel=kernel)


# ---- interim (replaced by the tuning-table planner of the h-kernels branch) ----------------------
@attrs.frozen
class TritonLaunch:
    """How the ``triton`` path launches one call (interim form)."""

    kernel: str
    kernel_row: str
    kernel_why: str
    tuning_row: str
    why: str
    source: str
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    combine_block_h: int
    combine_block_d: int
    fp8_f16: bool
    num_kv_splits: Optional[int]
    ids_per_split: Optional[int]
    rejected_kernels: tuple = ()
    fallback: Optional[str] = None


def plan_triton_launch(*, arch, q_dtype, kv_dtype, num_heads, num_tokens, topk, logit_cap, gluon, num_sms,
                       num_kv_splits=None, failed={}):
    cfg = triton_config(arch, q_dtype, kv_dtype, num_heads, num_tokens, topk)
    row = next(r for r in _table().rows if r.id == cfg.row)
    splits = ids = None
    kernel = "portable"
    fallback = None
    if num_sms is not None or num_kv_splits is not None:
        splits, ids = split_plan(cfg, num_tokens, num_heads, topk, num_sms or 1, requested=num_kv_splits)
        kernel = kernel_for(cfg, device_type="cpu" if arch == "cpu" else "cuda", q_dtype=q_dtype, kv_dtype=kv_dtype,
                            num_heads=num_heads, num_kv_splits=splits, logit_cap=logit_cap, gluon_ok=gluon)
        if kernel in failed:
            fallback = f"{kernel} failed to compile here: {failed[kernel]}"
            kernel = "portable"
    return TritonLaunch(kernel=kernel, kernel_row=cfg.row, kernel_why="", tuning_row=cfg.row, why=row.why,
                        source=row.source, block_h=cfg.block_h_for(num_heads), block_n=cfg.block_n,
                        num_warps=cfg.num_warps, num_stages=cfg.num_stages, combine_block_h=cfg.combine_block_h,
                        combine_block_d=cfg.combine_block_d, fp8_f16=cfg.fp8_f16, num_kv_splits=splits,
                        ids_per_split=ids, fallback=fallback)
