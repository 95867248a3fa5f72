"""A pure-PyTorch model of AITER's documented MLA decode contract, failure modes included.

:class:`AiterContractFake` models the documented contract; it is not evidence that AITER runs.
It lets the planners, buffers and finalize of :mod:`mla_sink.paths.aiter` be exercised on a CPU, and
each documented failure mode is reproduced so a test can show that the plan neutralises it (and that
without the plan it really appears). What it models, with sources:

* ``mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
  max_seqlen_q, page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0, num_kv_splits=None,
  num_kv_splits_indptr=None, work_meta_data=None, work_indptr=None, work_info_set=None,
  reduce_indptr=None, reduce_final_map=None, reduce_partial_map=None, q_scale=None,
  kv_scale=None, ..., return_lse=False) -> (logits, final_lse)``; ``o`` written in place; the LSE is
  natural log, fp32 ``[total_q, nhead]`` (ROCm/aiter ``aiter/mla.py``).
* ``logit_cap > 0`` fails an assert; fp16 q aborts; fp8 q without ``q_scale``/``kv_scale`` aborts;
  fewer than 16 heads is refused (mla-sink pads to 16; AITER pads nothing itself, and its 8-head kernels at one query
  row are not modelled); gfx942 has no non-persistent bf16 64-head kernel at one query row (docs/DESIGN.md "Facts
  about AITER").
* Non-persistent: a given ``num_kv_splits`` is honoured only together with ``num_kv_splits_indptr``,
  otherwise ``get_meta_param`` recomputes it (and its fp8 cap can bring it back to 1); token b reads
  ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (``aiter/mla.py``).
* Non-persistent ``return_lse``: garbage before 0.1.13, aborts 0.1.13-0.1.18, works from 0.1.19,
  except the one-split fp8 fast path, which leaves the LSE buffer unwritten (docs/DESIGN.md; ``aiter/mla.py``
  returns after stage 1 when ``num_kv_splits == 1`` and q is fp8).
* gfx950 bf16 32-head split-KV (more than one split) mishandles ragged tails: modelled as dropping
  the ids past the last multiple of 16 of a row (docs/DESIGN.md, aiter_lse_single_split).
* Persistent (``work_meta_data`` given): reads the work plan written by ``get_mla_metadata_v1``;
  with sparse metadata token t reads ``kv_indices[t * topk : t * topk + min(count_t, topk)]``
  (``csrc/kernels/mla/metadata/v1_2_device.cuh``); the metadata must be built for the same head count
  and dtypes; returns no LSE unless ``return_lse`` on a documented persistent+LSE kernel (gfx950 bf16;
  gfx950 fp8 except 16 heads at qlen 2; gfx942 fp8 64 heads at qlen 1), other persistent+LSE calls
  abort. Without an explicit ``num_kv_splits``, gfx950 bf16 16 heads qlen 1 with batch >= 32 falls
  back to the non-persistent kernel (``_use_persistent_mla_decode``).
* Empty rows: NaN output, LSE ``-inf`` (non-persistent) / ``+inf`` (persistent reduce).
* ``kv_indptr`` and the sparse plan's row starts ``t * topk`` are int32: a call of more than ``2^31 - 1`` id slots
  (``kv_indices``) would wrap them negative; the fake aborts such a call (its bound ``max_id_slots`` lowered by
  tests, which cannot allocate 2^31 ids) (``aiter/ops/attention.py``, ``csrc/kernels/mla/metadata/v1_2_device.cuh``).
* KV rows are addressed by a 32-bit byte offset from ``kv_buffer``'s first byte (buffer loads): a row that ends
  past ``2^32`` bytes is read from the wrong memory, which the fake reads as zeros (ROCm/aiter#5765: "returns
  approximately zero", no fault; #2768; every gfx942 kernel and most of gfx950's); its bound ``kv_window_bytes`` is
  lowered by tests, which cannot allocate 4 GiB pools with data.
* ``AITER_ENABLE_EXPERIMENTAL`` (``experimental``): fp8 persistent calls of ``nhead * max_seqlen_q`` = 128 (gfx942,
  gfx950) or 64 (gfx950) run the HipKittens kernel (``hk_mla_v32_decode_fwd`` in 0.1.19, ``hk_mla_decode_fwd`` in
  0.1.20), given neither the per-tensor scales nor ``final_lse`` (``aiter/mla.py`` ``use_hk``,
  ``csrc/include/mla_hk.h``).
* ``get_mla_metadata_v1`` takes ``work_info_set`` before ``work_indptr`` (the reverse of
  ``get_mla_metadata_info_v1``'s return order); passing them in info order aborts here (in AITER the
  kernel would write out of bounds) (``aiter/ops/attention.py``).

The fake synchronises freely (``.tolist()``); it is a test oracle, not a kernel.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from packaging.version import Version

#: What an unwritten LSE buffer holds in the fake (finite, so a missed write is silently wrong).
GARBAGE_LSE = 1234.5
_FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
_CU_NUM = {"gfx942": 304, "gfx950": 256}
_FP8_BLOCK_N = {8: 64, 16: 128, 24: 128, 32: 128, 48: 64, 64: 64, 128: 32, 256: 32, 384: 32, 512: 32}


class AiterAbort(RuntimeError):
    """Stands for a process abort inside AITER's asm wrapper (the real library kills the process)."""


class AiterContractFake:
    """Models the documented contract; not evidence that AITER runs.

    Args:
        version: the AITER version modelled (gates non-persistent ``return_lse``).
        arch: ``gfx942`` or ``gfx950`` (kernel availability, persistent+LSE combos, quirks).
        cu_num: compute units (split heuristic, metadata sizes); default 304 (gfx942) / 256 (gfx950).
        heuristic_splits: when set, ``get_meta_param(None, ...)`` returns this split count instead of
            the modelled heuristic (occupancy term and fp8 cap both replaced); an explicit
            ``num_kv_splits`` still goes through the fp8 cap.
        max_id_slots: the most ``kv_indices`` one call indexes before its int32 offsets wrap (default 2^31 - 1).
        kv_window_bytes: the bytes from ``kv_buffer``'s first byte within which KV rows are read right (default
            2^32: the kernels' 32-bit byte offsets); rows ending past it read as zeros.
        experimental: ``AITER_ENABLE_EXPERIMENTAL`` set: fp8 persistent calls of 128 query rows (64 on gfx950 too)
            run the HipKittens kernel, which reads the codes without ``q_scale`` / ``kv_scale`` and writes no
            ``final_lse``.

    Attributes:
        calls: one dict per ``mla_decode_fwd`` call (persistent, effective splits, return_lse, heads,
            ``max_seqlen_q`` as passed and ``qo_rows``, the most query rows of one batch in ``qo_indptr``, the
            ``batch`` size, ``kv_indices_size`` and the ``kv_indptr`` it was given, ...).
        metadata_fills: number of ``get_mla_metadata_v1`` calls.
        qlen_args: every query-length argument the fake was given, as ``(function, name, value)``
            (``max_seqlen_q`` of ``get_meta_param`` and ``mla_decode_fwd``, ``max_seqlen_qo`` of both
            metadata functions, ``uni_seqlen_qo`` of the fill).
        info_args: the split arguments of every ``get_mla_metadata_info_v1`` call (``num_kv_splits``,
            ``max_split_per_batch``).
    """

    def __init__(self, *, version: str = "0.1.20", arch: str = "gfx942", cu_num: Optional[int] = None,
                 heuristic_splits: Optional[int] = None, max_id_slots: int = 2 ** 31 - 1,
                 kv_window_bytes: int = 2 ** 32, experimental: bool = False) -> None:
        self.version = Version(version)
        self.experimental = experimental
        self.max_id_slots = max_id_slots
        self.kv_window_bytes = kv_window_bytes
        self.arch = arch
        self.cu_num = cu_num if cu_num is not None else _CU_NUM.get(arch, 256)
        self.heuristic_splits = heuristic_splits
        self.calls: list[dict[str, Any]] = []
        self.metadata_fills = 0
        self.qlen_args: list[tuple[str, str, Any]] = []
        self.info_args: list[dict[str, Any]] = []
        self._plans: dict[int, dict[str, Any]] = {}

    # ---- split heuristic ------------------------------------------------------------------------
    def get_meta_param(self, num_kv_splits, bs, total_kv, nhead, max_seqlen_q, dtype, tg_factor=1, ignore_total_kv=0):
        """Split count and ``num_kv_splits_indptr = arange(0, (bs + 1) * n, n)`` (int32)."""
        self.qlen_args.append(("get_meta_param", "max_seqlen_q", max_seqlen_q))
        if num_kv_splits is None and self.heuristic_splits is not None:
            n = self.heuristic_splits
            return n, torch.arange(0, (bs + 1) * n, n, dtype=torch.int32)
        if num_kv_splits is None:
            avg_kv = total_kv / bs  # best of 1..16 by occupancy x avg_kv / (avg_kv + overhead * splits)

            def score(i: int) -> float:
                return bs * i / (math.ceil(bs * i / self.cu_num) * self.cu_num) * avg_kv / (avg_kv + 84.1 * i)

            num_kv_splits = max(range(1, 17), key=score)
        if dtype in _FP8:
            block_n = _FP8_BLOCK_N[int(nhead * max_seqlen_q)]
            num_kv_splits = min(num_kv_splits, -(-total_kv // (bs * block_n)))
            if num_kv_splits > 1:
                num_kv_splits = min(num_kv_splits, int(abs(total_kv / bs - max_seqlen_q) // block_n) + 1)
        num_kv_splits = max(int(num_kv_splits), 1)
        return num_kv_splits, torch.arange(0, (bs + 1) * num_kv_splits, num_kv_splits, dtype=torch.int32)

    # ---- persistent metadata --------------------------------------------------------------------
    def get_mla_metadata_info_v1(self, batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                                 fast_mode=True, num_kv_splits=32, intra_batch_mode=False, max_split_per_batch=-1):
        """``(shape, dtype)`` of work_metadata_ptrs, work_indptr, work_info_set, reduce_indptr,
        reduce_final_map, reduce_partial_map (in that order). ``max_split_per_batch`` (from 0.1.16) is recorded in
        :attr:`info_args` (its effect on the sizes is not modelled)."""
        self.qlen_args.append(("get_mla_metadata_info_v1", "max_seqlen_qo", max_seqlen_qo))
        self.info_args.append({"num_kv_splits": num_kv_splits, "max_split_per_batch": max_split_per_batch})
        assert num_head_qo % 8 == 0, f"num_head_qo={num_head_qo} must be a multiple of 8"
        batches = batch_size * max_seqlen_qo if is_sparse else batch_size
        tiles = batches * max(1, math.ceil(num_head_qo / 128))
        return (
            ((2,), torch.uint64),
            ((self.cu_num + 1,), torch.int32),
            ((tiles + self.cu_num, 8), torch.int32),
            ((tiles + 1,), torch.int32),
            ((tiles, 2), torch.int32),
            ((2 * tiles,), torch.int32),
        )

    def get_mla_metadata_v1(self, seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens, num_heads_per_head_k,
                            num_heads_k, is_causal, work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr,
                            reduce_final_map, reduce_partial_map, page_size=1, kv_granularity=16, max_seqlen_qo=-1,
                            uni_seqlen_qo=-1, fast_mode=True, topk=-1, max_split_per_batch=-1,
                            intra_batch_mode=False, dtype_q=None, dtype_kv=None, **_: Any) -> None:
        """Write a one-work-per-token plan into the buffers, in place."""
        self.qlen_args += [("get_mla_metadata_v1", "max_seqlen_qo", max_seqlen_qo),
                           ("get_mla_metadata_v1", "uni_seqlen_qo", uni_seqlen_qo)]
        if work_info_set.dim() != 2 or work_info_set.shape[1] != 8 or work_indptr.dim() != 1:
            raise AiterAbort(
                "get_mla_metadata_v1: argument 8 must be work_info_set [#work, 8] and argument 9 work_indptr "
                f"[#cu + 1] (got {tuple(work_info_set.shape)} and {tuple(work_indptr.shape)}); "
                "the order is the reverse of get_mla_metadata_info_v1's"
            )
        if work_metadata_ptrs.dtype != torch.uint64 or work_metadata_ptrs.numel() != 2:
            raise AiterAbort("get_mla_metadata_v1: work_metadata_ptrs must be uint64 [2]")
        qo = seqlens_qo_indptr.tolist()
        kv = seqlens_kv_indptr.tolist()
        bs = len(qo) - 1
        if work_info_set.shape[0] < bs:
            raise AiterAbort(f"get_mla_metadata_v1: work_info_set has {work_info_set.shape[0]} rows for {bs} works")
        rows = []
        for b in range(bs):
            n = kv[b + 1] - kv[b]
            if topk > 0:
                start, n = b * topk, min(n, topk)
            else:
                start = kv[b]
            rows.append([b, -1, qo[b], qo[b + 1], start, start + n, 0, 0])
        work_info_set.fill_(-1)
        if rows:
            work_info_set[:bs] = torch.tensor(rows, dtype=torch.int32)
        work_indptr.fill_(bs)
        work_indptr[0] = 0
        self._plans[work_metadata_ptrs.data_ptr()] = {
            "heads": num_heads_per_head_k * num_heads_k, "dtype_q": dtype_q, "dtype_kv": dtype_kv, "topk": topk,
        }
        self.metadata_fills += 1

    # ---- decode ---------------------------------------------------------------------------------
    def mla_decode_fwd(self, q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                       page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0, num_kv_splits=None,
                       num_kv_splits_indptr=None, work_meta_data=None, work_indptr=None, work_info_set=None,
                       reduce_indptr=None, reduce_final_map=None, reduce_partial_map=None, q_scale=None,
                       kv_scale=None, intra_batch_mode=False, return_logits=False, return_lse=False, **_: Any):
        """Decode into ``o`` in place; returns ``(logits, final_lse)`` as documented (see module doc)."""
        assert logit_cap <= 0, f"logit_cap={logit_cap} is not supported"
        if q.dtype == torch.float16:
            raise AiterAbort("fp16 q: no MLA decode kernel (the asm wrapper aborts)")
        if q.dtype not in (torch.bfloat16, *_FP8):
            raise AiterAbort(f"q dtype {q.dtype} not supported")
        if q.dtype in _FP8 and (q_scale is None or kv_scale is None):
            raise AiterAbort("fp8 q needs q_scale and kv_scale")
        if kv_buffer.dtype in _FP8 and kv_scale is None:
            raise AiterAbort("fp8 KV needs kv_scale")
        if kv_buffer.dim() != 4 or tuple(kv_buffer.shape[1:3]) != (1, 1) or page_size != 1 or nhead_kv != 1:
            raise AiterAbort(f"kv_buffer must be [N, 1, 1, d] with page_size=1 (got {tuple(kv_buffer.shape)})")
        total_s, nhead, d_v = o.shape
        if q.shape[:2] != (total_s, nhead):
            raise AiterAbort(f"q {tuple(q.shape)} and o {tuple(o.shape)} disagree")
        if nhead < 16:
            raise AiterAbort(f"nhead={nhead}: the fake models 16 heads or more (mla-sink pads fewer to 16; AITER has "
                             "8-head kernels at one query row, and pads no head count itself)")
        if o.dtype != torch.bfloat16:
            raise AiterAbort(f"o must be bf16 (got {o.dtype})")
        bs = qo_indptr.shape[0] - 1
        if kv_indices.shape[0] > self.max_id_slots:
            raise AiterAbort(f"{kv_indices.shape[0]} id slots: kv_indptr and the row starts are int32, past "
                             f"{self.max_id_slots} they wrap negative")
        self.qlen_args.append(("mla_decode_fwd", "max_seqlen_q", max_seqlen_q))
        qo_rows = max((b - a for a, b in zip(qo_indptr.tolist(), qo_indptr.tolist()[1:])), default=0)
        fp8_q = q.dtype in _FP8
        bf16_both = q.dtype == torch.bfloat16 and kv_buffer.dtype == torch.bfloat16
        persistent = work_meta_data is not None
        if (persistent and num_kv_splits is None and self.arch == "gfx950" and bf16_both and nhead == 16
                and max_seqlen_q == 1 and bs >= 32):
            persistent = False  # concurrency gate: silently uses the non-persistent kernel
        record: dict[str, Any] = {"persistent": persistent, "return_lse": return_lse, "nhead": nhead,
                                  "max_seqlen_q": max_seqlen_q, "qo_rows": qo_rows, "sm_scale": sm_scale,
                                  "q_dtype": q.dtype, "num_kv_splits_arg": num_kv_splits,
                                  "num_kv_splits_indptr_given": num_kv_splits_indptr is not None,
                                  "batch": bs, "kv_indices_size": kv_indices.shape[0],
                                  "kv_indptr": kv_indptr.tolist()}
        self.calls.append(record)
        sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
        qf = q.float() * (q_scale.float().reshape(()) if q_scale is not None else 1.0)
        kvf = kv_buffer.reshape(kv_buffer.shape[0], -1).float() * (kv_scale.float().reshape(()) if kv_scale is not None else 1.0)
        size = kv_buffer.element_size()
        row_bytes, stride_bytes = kv_buffer[0].numel() * size, kv_buffer.stride(0) * size
        wrapped = torch.arange(kv_buffer.shape[0]) * stride_bytes + row_bytes > self.kv_window_bytes
        kvf[wrapped] = 0.0  # read from the wrong memory past the 32-bit window (ROCm/aiter#5765: about zero)
        qo = qo_indptr.tolist()
        ids_all = kv_indices.tolist()

        if not persistent:
            kernels = {16, 32, 64, 128} if not fp8_q else {16, 128}
            if self.arch == "gfx942" and not fp8_q:  # its 64-head bf16 row is for qSeqLen 0, and asm_mla.cu asks
                kernels = kernels - {64}  # for qSeqLen 1 at one query row: "cannot find suitable kernel"
            if nhead not in kernels:
                raise AiterAbort(f"no non-persistent kernel for nhead={nhead} q={q.dtype}")
            if return_lse and self.version < Version("0.1.13"):
                lse_mode = "garbage"
            elif return_lse and self.version < Version("0.1.19"):
                raise AiterAbort(f"return_lse aborts in AITER {self.version} (0.1.13-0.1.18)")
            else:
                lse_mode = "ok"
            if num_kv_splits is None or num_kv_splits_indptr is None:
                num_kv_splits, num_kv_splits_indptr = self.get_meta_param(
                    num_kv_splits, bs, kv_indices.shape[0], nhead, max_seqlen_q, q.dtype)
            if num_kv_splits_indptr.tolist() != list(range(0, (bs + 1) * num_kv_splits, num_kv_splits)):
                raise AiterAbort("num_kv_splits_indptr must be arange(0, (bs + 1) * n, n)")
            record["num_kv_splits"] = num_kv_splits
            one_split_fast = num_kv_splits == 1 and (
                fp8_q or (q.dtype == torch.bfloat16 and max_seqlen_q == 4) or (bf16_both and nhead in (8, 32)))
            if one_split_fast and fp8_q:
                lse_mode = "unwritten"
            # bf16 with one split (AITER's pick or forced): at 32 heads on gfx942 the early return's kernel takes no
            # LSE pointer (its argument area ends before ptr_LSEP); at 64 and 128 heads stage 2 only copies the
            # output (FINAL_OUT) and the stage-1 kernels write no LSE. Source: ROCm/aiter aiter/mla.py (the
            # one-split early return, MAYBE_FINAL_OUT, the stage-2 copy branch), csrc/py_itfs_cu/asm_mla.cu
            # (ptr_LSEP at argument offset 0x130), the .co kernels' argument areas (fortieth session's review)
            if num_kv_splits == 1 and bf16_both and (nhead in (64, 128) or (nhead == 32 and self.arch == "gfx942")):
                lse_mode = "unwritten"
            drop_tail = self.arch == "gfx950" and bf16_both and nhead == 32 and num_kv_splits > 1
            kv = kv_indptr.tolist()
            works = []
            for b in range(bs):
                ids = ids_all[kv[b]:kv[b + 1]]
                if drop_tail:
                    ids = ids[: len(ids) // 16 * 16]
                works.append((qo[b], qo[b + 1], ids))
            empty_lse = float("-inf")
        else:
            plan = self._plans.get(work_meta_data.data_ptr())
            if plan is None:
                raise AiterAbort("work_meta_data was not filled by get_mla_metadata_v1")
            if plan["heads"] != nhead:
                raise AiterAbort(f"metadata built for {plan['heads']} heads, called with {nhead} (out-of-bounds read)")
            for name, want, got in (("dtype_q", q.dtype, plan["dtype_q"]), ("dtype_kv", kv_buffer.dtype, plan["dtype_kv"])):
                if got is not None and (got in _FP8) != (want in _FP8):
                    raise AiterAbort(f"metadata built with {name}={got}, called with {want}")
            if not (16 <= nhead <= 128 and nhead % 16 == 0):
                raise AiterAbort(f"no persistent kernel for nhead={nhead}")
            if return_lse and not _persistent_lse_kernel(self.arch, q.dtype, kv_buffer.dtype, nhead, max_seqlen_q):
                raise AiterAbort(f"persistent return_lse aborts on {self.arch} q={q.dtype} nhead={nhead} qlen={max_seqlen_q}")
            record["num_kv_splits"] = num_kv_splits
            lse_mode = "ok"
            if return_lse and not _persistent_lse_written(self.arch, q.dtype, kv_buffer.dtype, nhead):
                lse_mode = "unwritten"  # for every token whose work is not split (modelled: every token)
            if fp8_q and self.experimental and (
                    nhead * max_seqlen_q == 128 or (self.arch == "gfx950" and nhead * max_seqlen_q == 64)):
                # the HipKittens kernel (hk_mla_v32_decode_fwd in 0.1.19, hk_mla_decode_fwd in 0.1.20; aiter/mla.py
                # use_hk, csrc/include/mla_hk.h): no q_scale / kv_scale, no final_lse (modelled: every token's
                # unwritten, the codes read unscaled)
                record["hk"] = True
                qf = q.float()
                kvf = kv_buffer.reshape(kv_buffer.shape[0], -1).float()
                lse_mode = "unwritten" if return_lse else lse_mode
            n_works = int(work_indptr[-1])
            works = [(r[2], r[3], ids_all[r[4]:r[5]]) for r in work_info_set[:n_works].tolist()]
            empty_lse = float("inf")

        final_lse = torch.full((total_s, nhead), GARBAGE_LSE, dtype=torch.float32)
        for q0, q1, ids in works:
            for s in range(q0, q1):
                if not ids:
                    o[s] = float("nan")
                    final_lse[s] = empty_lse
                    continue
                kv_rows = kvf[torch.tensor(ids, dtype=torch.long)]  # [n, 576]
                scores = (qf[s] @ kv_rows.T) * sm_scale  # [H, n]
                lse = torch.logsumexp(scores, dim=-1)
                o[s] = (torch.softmax(scores, dim=-1) @ kv_rows[:, :d_v]).to(o.dtype)
                final_lse[s] = lse
        if lse_mode == "unwritten":
            final_lse.fill_(GARBAGE_LSE)
        elif lse_mode == "garbage":
            final_lse = torch.rand_like(final_lse) * 100.0
        return o, (final_lse if return_lse else None)


def _persistent_lse_written(arch: str, q_dtype, kv_dtype, nhead: int) -> bool:
    """Whether a persistent kernel that takes return_lse writes the LSE of the tokens whose work is not split (the
    reduce writes the split ones'): gfx950's fp8 32-head kernel (``mla_a8w8_qh32_qseqlen1_gqaratio32_lse_ps.co``)
    has the same code as its non-LSE twin and an argument area that ends where ptr_LSEP starts, and
    ``mla_reduce_v1`` returns early for one split. Source: ROCm/aiter hsa/gfx950/mla/mla_asm.csv, the .co files,
    csrc/kernels/mla/reduce.cu (fortieth session's review)."""
    return not (arch == "gfx950" and q_dtype in _FP8 and kv_dtype in _FP8 and nhead == 32)


def _persistent_lse_kernel(arch: str, q_dtype, kv_dtype, nhead: int, max_seqlen_q: int) -> bool:
    """Persistent kernels that write an LSE (docs/DESIGN.md "Facts about AITER")."""
    fp8 = q_dtype in _FP8 and kv_dtype in _FP8
    if arch == "gfx950":
        return (q_dtype == torch.bfloat16 and kv_dtype == torch.bfloat16) or (fp8 and not (nhead == 16 and max_seqlen_q == 2))
    if arch == "gfx942":
        return fp8 and nhead == 64 and max_seqlen_q == 1
    return False


# ---- mla_decode_fwd_ds32 (gfx950): what its inputs are, modelled to show why no path takes fp8_ds_mla ----
#: The ds32 kernel's row strides, hard-coded in its launcher (never read from the tensors): latent bytes,
#: E8M0 scale bytes (one per 32 latent values) and bf16 RoPE values per row. Source: ROCm/aiter
#: ``csrc/kernels/mla/ds32_decode_fwd.cu`` (``stride_kv_nope_page = D_NOPE_SIZE`` ...),
#: ``csrc/kernels/mla/opus/defs.h`` (``D_SCALE_SIZE = D_NOPE_SIZE / 32``).
DS32_STRIDES = {"kv_nope": 512, "kv_scale": 16, "kv_rope": 64}
DS32_SCALE_BLOCK = 32


def ds32_kv_buffers(kv_cache: torch.Tensor) -> dict[str, torch.Tensor]:
    """The three dense buffers ``mla_decode_fwd_ds32`` reads, built from ``fp8_ds_mla`` rows ``[N, 656]``:
    ``kv_nope`` e4m3fn ``[N, 512]``, ``kv_scale`` uint8 E8M0 ``[N, 16]``, ``kv_rope`` bf16 ``[N, 64]``.

    Each float32 tile scale becomes the E8M0 byte of its exponent bits, repeated for the four 32-value
    blocks of its 128-value tile: what AITER's own test does to float factors (``_ds32_to_e8m0``:
    ``(s.view(int32) >> 23) & 0xFF``, ROCm/aiter ``op_tests/test_mla_persistent.py``). Every buffer is
    a copy: the kernel reads rows at the strides :data:`DS32_STRIDES`, the 656-byte rows interleave them.
    """
    rows = kv_cache.reshape(-1, 656)
    n = rows.shape[0]
    nope = rows[:, :512].contiguous().view(torch.float8_e4m3fn)
    scales = rows[:, 512:528].contiguous().view(torch.float32)  # [N, 4], little-endian as stored
    e8m0 = ((scales.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    scale = e8m0.repeat_interleave(128 // DS32_SCALE_BLOCK, dim=1)  # [N, 16]
    rope = rows[:, 528:].contiguous().view(torch.bfloat16)
    return {"kv_nope": nope.reshape(n, 512), "kv_scale": scale.reshape(n, 16), "kv_rope": rope.reshape(n, 64)}


def ds32_dequantize(buffers: dict[str, torch.Tensor]) -> torch.Tensor:
    """float64 ``[N, 576]``: the values the ds32 kernel attends to, each E8M0 byte ``b`` read as
    ``bit_cast<float>(b << 23) = 2^(b - 127)`` (ROCm/aiter ``ds32_decode_fwd.cu``, the kernel's scale read)."""
    nope, scale, rope = buffers["kv_nope"], buffers["kv_scale"], buffers["kv_rope"]
    n = nope.shape[0]
    factor = (scale.to(torch.int32) << 23).view(torch.float32).double()  # [N, 16]
    vals = nope.double().reshape(n, 16, DS32_SCALE_BLOCK) * factor.unsqueeze(-1)
    return torch.cat([vals.reshape(n, 512), rope.double()], dim=1)
