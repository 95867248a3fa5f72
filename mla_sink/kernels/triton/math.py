"""The math the Triton kernels (:mod:`~mla_sink.kernels.triton.portable`, :mod:`~mla_sink.kernels.triton.combine`)
share, written once as ``@triton.jit`` helpers. Triton inlines them, so the compiled kernels are the ones
the code written out in place would give.

The kernels keep scores and LSEs in base 2 (``log2 e`` folded into the score scale, so each exponential
is one ``exp2``); natural-log values (the ``lse`` output, the sink logits) cross over through
:data:`LOG2E`. Kernels call these helpers through the module (``kmath.sink_scale(...)``), so that
:func:`mla_sink.kernels.triton.interpreter.interpreter_stdlib` can swap in their interpreter builds for a
CPU launch.

Source: the online softmax of Triton tutorial 06 (fused attention); the sink formula of FlashMLA
``flash_mla_interface.py``; the e4m3fnuz encoding of the OCP 8-bit floating point specification and
AMD's fnuz variant (as in ``torch.float8_e4m3fnuz``).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: log2(e): a natural-log value times LOG2E is the same value in base 2.
LOG2E = tl.constexpr(1.4426950408889634)
#: fp32's largest finite value (the soft cap's argument clamps its scale ratio there: scores_base2).
FP32_MAX = tl.constexpr(3.4028234663852886e38)
#: fp32's smallest normal value, 2^-126 (its reciprocal, 2^126, is finite).
FP32_MIN_NORMAL = tl.constexpr(2.0 ** -126)

#: fp8 e4m3 codes: the sign bit; the low seven bits all ones (e4m3fn: NaN; e4m3fnuz: the largest finite
#: magnitude, 240); e4m3fnuz's only NaN, the sign bit alone (e4m3fn's -0).
FP8_SIGN = tl.constexpr(0x80)
FP8_LOW7 = tl.constexpr(0x7F)
FNUZ_NAN = tl.constexpr(0x80)
#: e4m3fnuz's largest finite value (240) in e4m3fn units (every fnuz code is worth half its fn value).
FNUZ_MAX_AS_FN = tl.constexpr(480.0)


@triton.jit
def id_valid(ids, num_rows):
    """``0 <= id < num_rows`` in one unsigned compare: a negative id reinterpreted as uint32 is at least
    2^31, and the launcher passes ``num_rows <= 2^31``. ``ids`` int32 (any shape), ``num_rows`` int32."""
    return ids.to(tl.uint32, bitcast=True) < num_rows.to(tl.uint32)


@triton.jit
def block_ids(idx_row, pos, end, num_rows, EVEN: tl.constexpr):
    """A block's ids and which of them are read: ``(ids, valid)`` for the positions ``pos`` (int32 ``[BLOCK_N]``) of
    one token's id row ``idx_row`` (``*int32``), ``valid`` = ``pos < end`` and :func:`id_valid`. ``EVEN`` (every
    block full, no ``topk_length``: the launcher's guarantee) drops the range mask, about 20% fewer instructions a
    step on sm90; otherwise a position at or past ``end`` reads no id (``-1``)."""
    if EVEN:
        ids = tl.load(idx_row + pos)
        valid = id_valid(ids, num_rows)
    else:
        in_range = pos < end
        ids = tl.load(idx_row + pos, mask=in_range, other=-1)
        valid = in_range & id_valid(ids, num_rows)
    return ids, valid


@triton.jit
def final_lse2(m_i, l_i):
    """The epilogue's statistics of a base-2 online softmax (:func:`online_softmax_step`'s ``m``, ``l``, fp32
    ``[BLOCK_H]``): ``(empty, l_safe, lse2)`` - the rows with no valid id (``l = 0``), ``l`` with those rows at 1
    (no division by zero) and the base-2 sink-free LSE ``m + log2 l`` (``-inf`` on empty rows)."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    return empty, l_safe, tl.where(empty, float("-inf"), m_i + tl.log2(l_safe))


@triton.jit
def fnuz_to_f32(x):
    """float8_e4m3fnuz codes (a uint8 tile: the launcher passes fnuz tensors as uint8 views) -> fp32 values.

    Decoded through e4m3fn's conversion, which runs on NVIDIA and the CPU too: e4m3fnuz has exponent bias
    8 where e4m3fn has 7, so every code is worth half its e4m3fn value; the codes e4m3fn reads as NaN
    (low seven bits all ones) are fnuz's +-240, and fnuz's only NaN is 0x80 (e4m3fn's -0).
    """
    bits = x.to(tl.uint8, bitcast=True)
    v = bits.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    v = tl.where((bits & FP8_LOW7) == FP8_LOW7, tl.where(bits >= FP8_SIGN, -FNUZ_MAX_AS_FN, FNUZ_MAX_AS_FN), v)
    return tl.where(bits == FNUZ_NAN, float("nan"), v) * 0.5


BF16_TO_F32_SHIFT = tl.constexpr(16)  # a bf16 value's bits are the high half of the same fp32 value's


@triton.jit
def finite_abs(x):
    """``|x|`` where finite, 0 at ``inf`` and NaN: the largest finite magnitude of a row, which a power-of-two
    row scale maps into fp16's range (an infinite max would make the scale 0 and ``inf * 0`` NaN)."""
    a = tl.abs(x)
    return tl.where(a < float("inf"), a, 0.0)


@triton.jit
def upcast(x, UPCAST: tl.constexpr):
    """A half tile (bf16 or fp16) in fp32 under the interpreter's ``UPCAST``, unchanged otherwise. bf16 is widened
    by its bits (shifted into an fp32's high half): Triton 3.9's interpreter converts bf16 subnormals (below
    2^-126) to other values (1e-39 to 4.4e-39, 9.2e-41 to 0); fp16 converts exactly."""
    if UPCAST:
        if x.dtype == tl.bfloat16:
            x = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << BF16_TO_F32_SHIFT).to(tl.float32, bitcast=True)
        else:
            x = x.to(tl.float32)
    return x


@triton.jit
def e4m3fn_to_f32_interpreted(x):
    """float8_e4m3fn tile -> fp32 values on Triton's CPU interpreter, whose conversion reads the NaN codes
    (low seven bits all ones) as +-480; the GPU's conversion already gives NaN for them. Used only under
    the kernels' ``UPCAST`` (interpreter) switch, so compiled kernels are unchanged."""
    bits = x.to(tl.uint8, bitcast=True)
    return tl.where((bits & FP8_LOW7) == FP8_LOW7, float("nan"), x.to(tl.float32))


@triton.jit
def fp8_tile(x, FNUZ: tl.constexpr, UPCAST: tl.constexpr, dtype: tl.constexpr):
    """An fp8 tile (e4m3fn, or e4m3fnuz codes with ``FNUZ``) in the dtype the kernel computes in: fp32 under
    the interpreter's ``UPCAST`` (its e4m3fn NaN codes decoded as NaN), else ``dtype``. e4m3fn converts
    directly (exact into fp16 / bf16); fnuz through :func:`fnuz_to_f32`."""
    if FNUZ:
        x = fnuz_to_f32(x)
    elif UPCAST:
        x = e4m3fn_to_f32_interpreted(x)
    if UPCAST:
        return x.to(tl.float32)
    return x.to(dtype)


@triton.jit
def e4m3_codes(ptr, offs, valid, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """A ``[BLOCK_N, TILE]`` tile of float8 e4m3fn codes read from byte pointers ``ptr[:, None] + offs[None, :]``
    (``ptr`` ``[BLOCK_N]``, uint8; rows where ``valid`` is False are not read and give 0), converted exactly to
    ``dtype`` (every e4m3 value is a bf16 and an fp16 value); fp32 under ``UPCAST`` (the interpreter), with the
    NaN codes decoded as NaN."""
    k8 = tl.load(ptr[:, None] + offs[None, :], mask=valid[:, None], other=0).to(tl.float8e4nv, bitcast=True)
    if UPCAST:
        k = e4m3fn_to_f32_interpreted(k8)
    else:
        k = k8.to(dtype)
    return k


@triton.jit
def ds_mla_rope_scores(q_rope, k_rope):
    """``q_rope @ k_rope^T`` (``[BLOCK_H, BLOCK_N]`` fp32) for the bf16 RoPE of ``fp8_ds_mla`` rows (``k_rope``
    ``[BLOCK_N, D_ROPE]`` bf16; ``q_rope`` ``[BLOCK_H, D_ROPE]`` in the kernel's q dtype). With bf16 q (and fp32
    under ``UPCAST``) in that dtype, which holds every bf16 value; with fp16 q in fp32 products
    (``input_precision="ieee"``: fp16 x bf16 products are exact in fp32), because fp16 holds neither bf16's
    range (a RoPE value above 65504 became inf) nor its small values (below 2^-14 fp16 has fewer bits)."""
    if q_rope.dtype == tl.float16:
        return tl.dot(q_rope.to(tl.float32), tl.trans(k_rope.to(tl.float32)), input_precision="ieee")
    else:
        return tl.dot(q_rope, tl.trans(k_rope.to(q_rope.dtype)))


@triton.jit
def ds_mla_pv(acc, p, scale, k):
    """``acc + (p * scale[None, :]) @ k``: the P.V product of one 128-column tile of ``fp8_ds_mla`` rows, whose
    values are the e4m3 tile ``k [BLOCK_N, TILE]`` times a float32 scale per row (``scale [BLOCK_N]``).

    ``p [BLOCK_H, BLOCK_N]`` (fp32 weights in ``[0, 1]``) times the scales is divided, per head, by its largest
    magnitude in the block (``w`` in ``[-1, 1]``: no overflow in fp16 or bf16, whatever the scales), rounded once
    to ``k``'s dtype (as P is for every other KV dtype), and the fp32 product is multiplied back per head. Per head
    rather than by the block's largest scale: with fp16 (q's dtype for fp16 q) a block mixing scales 1e6 apart sent
    the small-scale rows' weights below fp16's range while a large-scale row with a weight near 0 set the divisor
    (output error 7.8e-3 at 1e6, 0.75 at 1e8 on an fp16-exact interpreter run; twenty-fourth session's break test).
    Now only terms below 2^-24 of the head's largest term in the block are lost. ``acc`` fp32 ``[BLOCK_H, TILE]``.
    """
    ps = p * scale[None, :]
    # at least fp32's smallest normal: 1 / pmax stays finite (the reciprocal of a subnormal overflows, and inf * 0
    # is NaN), and a smaller divisor only makes w smaller; all 0 (no valid row) gives w = 0
    pmax = tl.maximum(tl.max(tl.abs(ps), 1), FP32_MIN_NORMAL)
    w = ps * (1.0 / pmax)[:, None]
    return acc + tl.dot(w.to(k.dtype), k) * pmax[:, None]


@triton.jit
def scores_base2(qk, qk_scale, logit_cap, HAS_CAP: tl.constexpr):
    """Base-2 scores from the raw products ``qk`` (fp32 ``[BLOCK_H, BLOCK_N]``): ``qk * qk_scale * log2 e``, or
    with ``HAS_CAP`` the soft cap ``cap * tanh(qk * qk_scale / cap) * log2 e``, computed without cancellation: an
    odd Taylor polynomial where ``|x| < 0.1`` (truncation < 1e-10 relative), ``exp(-2|x|)`` (never overflows)
    elsewhere. The cap's argument is ``qk * (qk_scale / cap)``: ``qk * qk_scale`` may overflow fp32 where the capped
    score is finite (then every such id would get the same score ``cap``, where the float64 reference tells them
    apart); the ratio is clamped to fp32's largest value, so that a ratio beyond it keeps ``0 * ratio = 0`` and
    sends any other product to ``+-inf``, whose tanh, ``+-1``, is then the reference's to fp32 precision. A product
    ``qk`` of ``+-inf`` is capped to ``+-cap`` as the reference caps an infinite score (an infinite q or KV value);
    one that overflowed fp32 from finite values is capped the same way, with the sign of the overflowed sum, which
    may differ from the float64 one (README)."""
    if HAS_CAP:
        # NaN propagates: a NaN q_scale / kv_scale (folded into qk_scale) gives NaN scores, as without the cap
        # (Triton's default minimum returns the other operand, FP32_MAX, and every score was capped instead)
        x = qk * tl.minimum(qk_scale / logit_cap, FP32_MAX, propagate_nan=tl.PropagateNan.ALL)
        ax = tl.abs(x)
        e = tl.exp(-2.0 * ax)
        t_big = (1.0 - e) / (1.0 + e)
        x2 = x * x
        t_small = ax * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0 - x2 * (17.0 / 315.0))))
        t_abs = tl.where(ax < 0.1, t_small, t_big)
        s = logit_cap * tl.where(x < 0.0, -t_abs, t_abs)
        s = s * LOG2E
    else:
        s = qk * (qk_scale * LOG2E)
    return s


@triton.jit
def online_softmax_step(m_i, l_i, s):
    """One block of the online softmax, base 2 (rows = heads, columns = ids of the block).

    Args:
        m_i: fp32 ``[BLOCK_H]`` running max of the scores (``-inf`` while a row has no valid id).
        l_i: fp32 ``[BLOCK_H]`` running sum of ``2^(s - m_i)``.
        s: fp32 ``[BLOCK_H, BLOCK_N]`` base-2 scores of the block, ``-inf`` where the id is invalid.

    Returns:
        ``(m_new, l_new, p, alpha)``: the updated max and sum, ``p = 2^(s - m_new)`` (the block's weights)
        and ``alpha = 2^(m_i - m_new)``, by which the caller rescales what it accumulated so far. A row
        still without a valid id keeps ``m = -inf``: its max is taken as 0 (no ``-inf - -inf``), so its
        ``p`` and ``alpha`` are 0 and ``l`` stays 0.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    return m_new, l_new, p, alpha


@triton.jit
def sink_scale(scale, sink, lse2, empty):
    """The sink epilogue: ``scale * sigmoid(lse - sink)`` per head row, 0 on empty rows.

    ``sigmoid(lse - sink) = exp(lse) / (exp(lse) + exp(sink)) = 1 / (1 + 2^((sink - lse) log2 e))``, the
    share of the softmax denominator that the sink leaves to the ids: ``sink = -inf`` gives ``scale``,
    ``sink = +inf`` gives 0.

    Args:
        scale: what the factor multiplies (1.0, or the row's ``1 / l``).
        sink: fp32 ``[BLOCK_H]`` natural-log sink logits (``-inf`` for padded heads).
        lse2: fp32 ``[BLOCK_H]`` base-2 sink-free LSE (``-inf`` on empty rows).
        empty: ``[BLOCK_H]`` rows with no valid id.
    """
    diff = tl.where(empty, 0.0, sink * LOG2E - lse2)  # no -inf - -inf on empty rows
    return tl.where(empty, 0.0, scale / (1.0 + tl.exp2(diff)))


@triton.jit
def splits_max_and_sum(PART_LSE, pid_t, offs_s, offs_h, mask_h, num_splits, stride_plt, stride_pls):
    """The combine kernel's first read: the base-2 LSEs of a token's splits (``offs_s`` split slots,
    ``-inf`` past ``num_splits`` and on padded heads) reduced per head to ``(m_safe, empty, l_sum)``: the
    largest LSE (0 on an empty row and where it is ``+inf``), whether every split is empty, and
    ``sum 2^(lse - m_safe)``. A split whose LSE is ``+inf`` thus makes ``l_sum`` ``+inf``: the row's LSE is
    ``+inf`` and its output NaN (``2^(+inf - 0) o / +inf``), as :func:`mla_sink.core.lse.merge_states` gives
    (its weight ``exp(+inf - +inf)`` has no value), where the max itself would make the LSE NaN. A NaN LSE (a NaN
    score in that split) makes the row's max NaN, so its LSE and output are NaN, as ``merge_states`` gives: the
    max alone (``max.f32``, IEEE maxNum) skips a NaN, which left a NaN split beside empty ones an empty row."""
    pl = PART_LSE + pid_t * stride_plt + offs_s[:, None] * stride_pls + offs_h[None, :]
    lses = tl.load(pl, mask=(offs_s[:, None] < num_splits) & mask_h[None, :], other=float("-inf"))
    m = tl.max(lses, 0)  # [BLOCK_H]
    m = tl.where(tl.max((lses != lses).to(tl.int32), 0) > 0, float("nan"), m)  # a NaN split: no max skips it
    empty = m == float("-inf")
    m_safe = tl.where(empty | (m == float("inf")), 0.0, m)
    return m_safe, empty, tl.sum(tl.exp2(lses - m_safe[None, :]), 0)


@triton.jit
def combine_store(acc, m_safe, empty, l_sum, SINKS, OUT, LSE, pid_t, pid_d, offs_h, offs_d, mask_h,
                  stride_ot, stride_oh, stride_lt, stride_lh, HAS_SINKS: tl.constexpr):
    """The combine kernel's epilogue: ``out = acc / l_sum`` times the sink factor (:func:`sink_scale`, the
    sink applied once), 0 on empty rows; the first column block (``pid_d == 0``) also writes the natural-log
    LSE (``-inf`` on empty rows)."""
    l_safe = tl.where(empty, 1.0, l_sum)
    out = acc / l_safe[:, None]
    lse2 = tl.where(empty, float("-inf"), m_safe + tl.log2(l_safe))
    if HAS_SINKS:
        sink = tl.load(SINKS + offs_h, mask=mask_h, other=float("-inf"))
        out = out * sink_scale(1.0, sink, lse2, empty)[:, None]
    o_ptr = OUT + pid_t * stride_ot + offs_h.to(tl.int64)[:, None] * stride_oh + offs_d[None, :]  # any head stride
    tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=mask_h[:, None])
    if pid_d == 0:
        tl.store(LSE + pid_t * stride_lt + offs_h * stride_lh, lse2 / LOG2E, mask=mask_h)


@triton.jit
def split_state(base_o, base_l, s, stride_ps, stride_pls, live):
    """The combine kernel's read of split ``s``: its partial output tile ``[BLOCK_H, BLOCK_D]`` and its
    base-2 LSE as a ``[BLOCK_H, 1]`` column; where ``live`` (``[BLOCK_H, 1]``) is false nothing is read
    and they are ``0`` / ``-inf``."""
    return (tl.load(base_o + s * stride_ps, mask=live, other=0.0),
            tl.load(base_l + s * stride_pls, mask=live, other=float("-inf")))


@triton.jit
def add_split(acc, o, ls, m_col, ZERO_WEIGHT_NAN: tl.constexpr):
    """The combine kernel's step: ``acc + 2^(ls - m) o`` (``ls``, ``m_col``: ``[BLOCK_H, 1]`` columns). A split
    of weight 0 (``ls = -inf``) adds 0 times its partial: with ``ZERO_WEIGHT_NAN`` (the library's own split
    launches, whose kernels write exactly 0 where a split has no valid id) a NaN there stays NaN, as the unsplit
    kernels' ``0 * inf`` does (an ``inf`` value column of an id whose score is ``-inf``, README semantics);
    without it (the DCP merge, whose parts any path may write) such a split adds nothing, whatever its partial
    holds, as :func:`mla_sink.core.lse.merge_states` does."""
    w = tl.exp2(ls - m_col)
    if ZERO_WEIGHT_NAN:
        return acc + w * o
    return acc + tl.where(w > 0.0, w * o, 0.0)


@triton.jit
def _states4(base_o, base_l, s, stride_ps, stride_pls, n_live):
    """The reads of splits ``s .. s + 3`` (:func:`split_state`), as one tuple ``(o_s, ls_s, .., o_s+3, ls_s+3)``."""
    o0, l0 = split_state(base_o, base_l, s, stride_ps, stride_pls, s < n_live)
    o1, l1 = split_state(base_o, base_l, s + 1, stride_ps, stride_pls, s + 1 < n_live)
    o2, l2 = split_state(base_o, base_l, s + 2, stride_ps, stride_pls, s + 2 < n_live)
    o3, l3 = split_state(base_o, base_l, s + 3, stride_ps, stride_pls, s + 3 < n_live)
    return o0, l0, o1, l1, o2, l2, o3, l3


@triton.jit
def _add4(acc, states, m_col, ZERO_WEIGHT_NAN: tl.constexpr):
    """``acc`` plus four splits' weighted partials (:func:`add_split`) read by :func:`_states4`."""
    acc = add_split(acc, states[0], states[1], m_col, ZERO_WEIGHT_NAN)
    acc = add_split(acc, states[2], states[3], m_col, ZERO_WEIGHT_NAN)
    acc = add_split(acc, states[4], states[5], m_col, ZERO_WEIGHT_NAN)
    return add_split(acc, states[6], states[7], m_col, ZERO_WEIGHT_NAN)


@triton.jit
def split_group_states(base_o, base_l, s, stride_ps, stride_pls, n_live, GROUP: tl.constexpr):
    """The reads of splits ``s .. s + GROUP - 1`` (``GROUP`` 4, 8 or 16), issued together, as four
    :func:`_states4` tuples (those past ``GROUP`` alias the first and are never added)."""
    a = _states4(base_o, base_l, s, stride_ps, stride_pls, n_live)
    b = a
    c = a
    d = a
    if GROUP >= 8:
        b = _states4(base_o, base_l, s + 4, stride_ps, stride_pls, n_live)
    if GROUP >= 16:
        c = _states4(base_o, base_l, s + 8, stride_ps, stride_pls, n_live)
        d = _states4(base_o, base_l, s + 12, stride_ps, stride_pls, n_live)
    return a, b, c, d


@triton.jit
def add_split_states(acc, states, m_col, GROUP: tl.constexpr, ZERO_WEIGHT_NAN: tl.constexpr):
    """``acc`` plus the weighted partials of a group read by :func:`split_group_states` (:func:`add_split`)."""
    acc = _add4(acc, states[0], m_col, ZERO_WEIGHT_NAN)
    if GROUP >= 8:
        acc = _add4(acc, states[1], m_col, ZERO_WEIGHT_NAN)
    if GROUP >= 16:
        acc = _add4(acc, states[2], m_col, ZERO_WEIGHT_NAN)
        acc = _add4(acc, states[3], m_col, ZERO_WEIGHT_NAN)
    return acc


@triton.jit
def add_split_group(acc, base_o, base_l, s, stride_ps, stride_pls, n_live, m_col, GROUP: tl.constexpr,
                    ZERO_WEIGHT_NAN: tl.constexpr):
    """The combine kernel's step: splits ``s .. s + GROUP - 1`` (``GROUP`` 4, 8 or 16) added to ``acc``, every one
    of their loads issued before any of their math, so that a program waits on memory once per group."""
    states = split_group_states(base_o, base_l, s, stride_ps, stride_pls, n_live, GROUP)
    return add_split_states(acc, states, m_col, GROUP, ZERO_WEIGHT_NAN)
