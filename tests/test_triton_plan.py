"""The Triton launch plan (mla_sink/paths/triton/plan.py) and its table (tables/triton_tuning.yaml), on the CPU.

The kernel choice and the split counts are compared, on a grid of shapes, with a copy of the rules the code
had before the Gluon kernels became rows of the table (``kernel_for`` and the tuning rows' ``kernel`` param,
commit 3f27c12), amended only by the routing changes measured since, each marked with its session; tests may
spell those rules out, the package may not.
"""

from __future__ import annotations

import itertools
import math

import attrs
import re

import pytest

from mla_sink import dispatch
from mla_sink.core import tables as core_tables
from mla_sink.core.tables import table_path
from mla_sink.paths.triton import plan as P

DTYPES = ("bf16", "fp16", "fp8_e4m3", "fp8_e4m3fnuz")
ARCHS = ("sm90", "sm80", "gfx942", "cpu")
HEADS = (1, 16, 17, 32, 33, 65, 128)
TOKENS = (1, 2, 3, 64, 256)
TOPKS = (37, 2048)
SMS = (1, 132)


def plan(**kw):
    args = dict(arch="sm90", q_dtype="bf16", kv_dtype="bf16", num_heads=128, num_tokens=256, topk=2048,
                logit_cap=0.0, gluon=True, num_sms=132)
    args.update(kw)
    return P.plan_triton_launch(**args)


# ---- copy of the rules before this change (commit 3f27c12), with the later measured changes marked -----

def _old_splits(cfg, T, H, topk, sms, requested=None):
    """num_kv_splits_for + split_plan as they were."""
    block_h = min(cfg.block_h, max(16, 1 << max(0, (H - 1).bit_length())))
    if requested is None:
        programs = max(1, T * -(-H // block_h))
        if programs >= cfg.split_min_fill * sms:
            requested = 1
        else:
            want = math.ceil(cfg.split_waves * sms / programs)
            most = max(1, math.ceil(topk / cfg.min_ids_per_split))
            requested = max(1, min(want, cfg.max_kv_splits, most))
    ids = max(topk, 1)
    splits = max(1, min(int(requested), -(-ids // cfg.block_n)))
    ids_per_split = -(-(-(-ids // splits)) // cfg.block_n) * cfg.block_n
    return -(-ids // ids_per_split), ids_per_split


def _old_kernel(row, *, arch, q_dtype, kv_dtype, num_heads, num_tokens, splits, logit_cap, gluon, block_h, topk=2048):
    """The tuning row's ``kernel`` param, then kernel_for, as they were."""
    kernel = _old_kernel_any_topk(row, arch=arch, q_dtype=q_dtype, kv_dtype=kv_dtype, num_heads=num_heads,
                                  num_tokens=num_tokens, splits=splits, logit_cap=logit_cap, gluon=gluon,
                                  block_h=block_h)
    # since the forty-first session a topk that is not a multiple of 16 ids (the row stride of contiguous indices,
    # which the seesaw's launcher needs aligned and had sent to the portable kernel unannounced) is planned there
    return "portable" if kernel == "gluon_seesaw" and topk % 16 else kernel


def _old_kernel_any_topk(row, *, arch, q_dtype, kv_dtype, num_heads, num_tokens, splits, logit_cap, gluon, block_h):
    kernel = {"sm90_default": "gluon_seesaw", "sm90_fp8": "gluon_seesaw", "sm90_fp8_h16": "gluon_fp8",
              "sm90_fp8_h16_two_tokens": "gluon_fp8", "sm90_fp8_h32": "gluon_seesaw",
              "sm90_fp8_h32_one_token": "gluon_seesaw", "sm90_h32": "gluon_seesaw"}.get(row, "portable")
    # since the twenty-seventh session bf16 at H <= 16 and T <= 8 takes the padded seesaw (sm90_h16's split policy)
    if row == "sm90_h16" and q_dtype == kv_dtype == "bf16" and num_tokens <= 8:
        kernel = "gluon_seesaw"
    if kernel == "portable" or not (gluon and arch != "cpu" and not logit_cap > 0):
        return "portable"
    # sm90_fp8_h32_one_token: sm90_fp8_h32's 64-id splits at T <= 2 since the twenty-seventh session, at T=1 since
    # the thirty-first
    if row in ("sm90_fp8_h32", "sm90_fp8_h32_one_token") and kv_dtype == "fp8_e4m3" and q_dtype in ("bf16", "fp16"):
        return "gluon_fp8"  # since the tenth session: 32-head blocks of gluon_fp8, unsplit or in two splits; since
        # the sixteenth, at any split count (its column-split consumers)
    # gluon_fp8 splits since the ninth session, up to 2 splits (more at <= 16 heads went to the padded seesaw from
    # the seventh session); since the twenty-seventh at any split count
    if kernel == "gluon_seesaw" and row == "sm90_h16":
        return kernel if gluon and arch == "sm90" and not logit_cap > 0 else "portable"
    if kernel == "gluon_seesaw":
        ok = q_dtype in ("bf16", "fp16") and (
            (block_h == 64 and (q_dtype == kv_dtype or kv_dtype == "fp8_e4m3"))
            or (kv_dtype == "fp8_e4m3" and num_heads > 16)  # since 2026-12-01: e4m3 at 17-32 heads, padded
            or (q_dtype == kv_dtype and num_heads > 16))  # since the eighth session: bf16 / fp16 too
    else:
        ok = kv_dtype == "fp8_e4m3" and q_dtype in ("bf16", "fp16") and num_heads <= 16
    return kernel if ok else "portable"


def test_kernels_and_splits_as_before_on_a_grid():
    seen = set()
    for arch, q, kv, H, T, topk, sms, cap, gluon in itertools.product(
            ARCHS, DTYPES, DTYPES, HEADS, TOKENS, TOPKS, SMS, (0.0, 30.0), (True, False)):
        got = plan(arch=arch, q_dtype=q, kv_dtype=kv, num_heads=H, num_tokens=T, topk=topk, num_sms=sms,
                   logit_cap=cap, gluon=gluon)
        cfg = P.triton_config(arch, q, kv, H, T, topk=topk)
        assert got.tuning_row == cfg.row
        splits = _old_splits(cfg, T, H, topk, sms)
        assert (got.num_kv_splits, got.ids_per_split) == splits
        want = _old_kernel(cfg.row, arch=arch, q_dtype=q, kv_dtype=kv, num_heads=H, num_tokens=T, splits=splits[0],
                           logit_cap=cap, gluon=gluon, block_h=cfg.block_h_for(H), topk=topk)
        assert got.kernel == want, (arch, q, kv, H, T, topk, sms, cap, gluon, got)
        assert got.fallback is None  # no kernel failed to compile
        # the seesaw a topk without whole 16-id rows keeps from: its path's requirement, stated among the rejections
        unaligned = want == "portable" and topk % 16 != 0 and _old_kernel_any_topk(
            cfg.row, arch=arch, q_dtype=q, kv_dtype=kv, num_heads=H, num_tokens=T, splits=splits[0], logit_cap=cap,
            gluon=gluon, block_h=cfg.block_h_for(H)) == "gluon_seesaw"
        seesaw = [why for label, why in got.rejected_kernels if label.startswith("gluon_seesaw (")]
        assert not unaligned or (seesaw and f"topk={topk}, needs a multiple of 16" in seesaw[0]), got
        seen.add(got.kernel)
    assert seen == set(P.KERNELS)  # the grid reaches every kernel


def test_forced_split_counts_as_before():
    for arch, H, T, topk, req in itertools.product(("sm90", "cpu", "gfx942"), (5, 16, 128), (1, 256),
                                                   (1, 37, 2048), (1, 2, 3, 16, 64)):
        got = plan(arch=arch, num_heads=H, num_tokens=T, topk=topk, num_kv_splits=req)
        assert (got.num_kv_splits, got.ids_per_split) == _old_splits(P.triton_config(arch, "bf16", "bf16", H, T,
                                                                                     topk=topk),
                                                                     T, H, topk, 132, requested=req)


@pytest.mark.parametrize("field,value", [("arch", "cpu"), ("logit_cap", 30.0), ("gluon", False),
                                         ("kv_dtype", "fp8_e4m3fnuz"), ("q_dtype", "fp8_e4m3fnuz")])
def test_gluon_never_on_cpu_capped_without_gluon_or_fnuz(field, value):
    for q, kv, H, T in itertools.product(DTYPES, DTYPES, HEADS, (64, 256, 1024)):
        kw = dict(q_dtype=q, kv_dtype=kv, num_heads=H, num_tokens=T)
        kw[field] = value
        assert plan(**kw).kernel == "portable", kw


def test_gluon_fp8_serves_e4m3_at_every_split_count_up_to_32_heads():
    for q, kv, H, T, sms in itertools.product(DTYPES, DTYPES, HEADS, TOKENS, SMS):
        got = plan(q_dtype=q, kv_dtype=kv, num_heads=H, num_tokens=T, num_sms=sms)
        if got.kernel == "gluon_fp8":
            assert kv == "fp8_e4m3" and H <= 32
        forced = plan(q_dtype=q, kv_dtype=kv, num_heads=H, num_tokens=T, num_sms=sms, num_kv_splits=3)
        # e4m3 with bf16 / fp16 q at <= 32 heads: gluon_fp8 at any split count (twenty-seventh session)
        want = "gluon_fp8" if kv == "fp8_e4m3" and q in ("bf16", "fp16") and H <= 32 else forced.kernel
        assert forced.kernel == want, (q, kv, H, T)


def test_where_the_gluon_kernels_serve():
    ws = plan()
    assert (ws.kernel, ws.kernel_row, ws.tuning_row, ws.num_kv_splits) == ("gluon_seesaw", "sm90_bf16_gluon_seesaw",
                                                                           "sm90_default", 1)
    assert "seesaw" in ws.kernel_why and ws.block_h == 64 and ws.fallback is None
    assert plan(q_dtype="fp16", kv_dtype="fp16", num_heads=33).kernel == "gluon_seesaw"
    small = plan(num_tokens=2)  # split: the seesaw kernel and the combine
    assert small.kernel == "gluon_seesaw" and small.num_kv_splits > 1
    h32 = plan(num_heads=32)  # 17-32 heads: the seesaw, padded to a 64-head block; the split policy stays the
    assert (h32.kernel, h32.kernel_row, h32.tuning_row) == ("gluon_seesaw", "sm90_bf16_gluon_seesaw", "sm90_h32")
    assert plan(q_dtype="fp16", kv_dtype="fp16", num_heads=17).kernel == "gluon_seesaw"  # 32-head row's
    assert plan(num_heads=16).kernel == "portable"  # 16-head blocks: the portable row's
    # bf16 at <= 16 heads and <= 8 tokens: the seesaw, padded to 64 heads, with the portable row's split policy
    few = plan(num_heads=16, num_tokens=8)
    assert (few.kernel, few.kernel_row, few.tuning_row) == ("gluon_seesaw", "sm90_bf16_gluon_seesaw_few_heads",
                                                            "sm90_h16")
    assert plan(num_heads=1, num_tokens=1).kernel == "gluon_seesaw"
    assert plan(num_heads=16, num_tokens=9).kernel == "portable"
    assert plan(q_dtype="fp16", kv_dtype="fp16", num_heads=16, num_tokens=2).kernel == "portable"
    assert plan(q_dtype="bf16", kv_dtype="fp16").kernel == "portable"  # q and KV of one dtype
    f8 = plan(kv_dtype="fp8_e4m3", num_heads=16)
    assert (f8.kernel, f8.kernel_row, f8.tuning_row) == ("gluon_fp8", "sm90_fp8_gluon", "sm90_fp8_h16")
    assert plan(q_dtype="fp16", kv_dtype="fp8_e4m3", num_heads=3).kernel == "gluon_fp8"
    f8_17 = plan(kv_dtype="fp8_e4m3", num_heads=17)  # 17-32 heads: gluon_fp8's 32-head blocks
    assert (f8_17.kernel, f8_17.kernel_row, f8_17.tuning_row) == ("gluon_fp8", "sm90_fp8_gluon_h32", "sm90_fp8_h32")
    f8_32 = plan(kv_dtype="fp8_e4m3", num_heads=32, num_tokens=64)  # two splits at 32 heads: gluon_fp8
    assert (f8_32.kernel, f8_32.num_kv_splits) == ("gluon_fp8", 2)
    f8_32_split = plan(kv_dtype="fp8_e4m3", num_heads=32, num_tokens=2)  # more splits: its column-split consumers
    assert (f8_32_split.kernel, f8_32_split.kernel_row) == ("gluon_fp8", "sm90_fp8_gluon_h32")
    assert f8_32_split.num_kv_splits > 2
    # one token: one 64-id block a split (sm90_fp8_h32_one_token); from two tokens 128-id splits (thirty-first
    # session: 16 splits of two 16-head CTAs at T=2 beat 32 one-block splits)
    assert (f8_32_split.tuning_row, f8_32_split.num_kv_splits, f8_32_split.ids_per_split) == (
        "sm90_fp8_h32", 16, 128)
    f8_32_t1 = plan(kv_dtype="fp8_e4m3", num_heads=32, num_tokens=1)
    assert (f8_32_t1.tuning_row, f8_32_t1.num_kv_splits, f8_32_t1.ids_per_split) == (
        "sm90_fp8_h32_one_token", 32, 64)
    f8_32_t3 = plan(kv_dtype="fp8_e4m3", num_heads=32, num_tokens=3)
    assert (f8_32_t3.tuning_row, f8_32_t3.num_kv_splits, f8_32_t3.ids_per_split) == ("sm90_fp8_h32", 16, 128)
    assert plan(kv_dtype="fp8_e4m3", num_heads=33).kernel == "gluon_seesaw"
    f8_split = plan(kv_dtype="fp8_e4m3", num_heads=16, num_tokens=2)  # more splits at 16 heads: gluon_fp8 too
    assert (f8_split.kernel, f8_split.kernel_row, f8_split.tuning_row) == ("gluon_fp8", "sm90_fp8_gluon",
                                                                           "sm90_fp8_h16_two_tokens")
    assert (f8_split.num_kv_splits, f8_split.ids_per_split) == (32, 64)
    f8_t8 = plan(kv_dtype="fp8_e4m3", num_heads=16, num_tokens=8)
    assert (f8_t8.kernel, f8_t8.tuning_row) == ("gluon_fp8", "sm90_fp8_h16") and f8_t8.num_kv_splits > 2
    f8_two = plan(kv_dtype="fp8_e4m3", num_heads=16, num_tokens=64)  # two splits at 16 heads: gluon_fp8
    assert (f8_two.kernel, f8_two.kernel_row, f8_two.num_kv_splits) == ("gluon_fp8", "sm90_fp8_gluon", 2)
    assert plan(q_dtype="fp8_e4m3", kv_dtype="fp8_e4m3", num_heads=16).kernel == "portable"
    for arch in ("sm80", "sm100", "gfx942", "gfx950", "sm120"):
        assert plan(arch=arch).kernel == "portable"


def test_rejected_kernels_say_why():
    split = plan(num_tokens=2, q_dtype="bf16", kv_dtype="fp16")  # 2 programs on 132 SMs: split
    assert split.kernel == "portable" and split.num_kv_splits > 1
    # every Gluon path serves split launches: each row says its own mismatches, its split bound among them
    rejected = dict(split.rejected_kernels)
    assert rejected["sm90_fp8_gluon"].startswith("kv_dtype=fp16, needs fp8_e4m3")
    assert "q_dtype=bf16, needs fp16" in rejected["sm90_fp16_gluon_seesaw"]
    unsplit = dict(plan(num_tokens=256).rejected_kernels)  # requirements hold: each row says its own mismatch
    assert set(unsplit) == {"sm90_fp8_gluon", "sm90_fp8_gluon_h32", "sm90_bf16_gluon_seesaw_few_heads"}
    assert unsplit["sm90_bf16_gluon_seesaw_few_heads"].startswith("num_heads=128, needs <= 16")
    assert "num_tokens=256, needs <= 8" in unsplit["sm90_bf16_gluon_seesaw_few_heads"]
    assert all(unsplit[row].startswith("kv_dtype=bf16, needs fp8_e4m3") for row in unsplit
               if row != "sm90_bf16_gluon_seesaw_few_heads")
    assert "num_heads=128, needs <= 32" in unsplit["sm90_fp8_gluon_h32"]
    assert plan(kv_dtype="fp8_e4m3", num_heads=16).rejected_kernels == ()  # the first row is the winner
    cpu = plan(arch="cpu", num_sms=1)
    assert cpu.kernel == "portable" and dict(cpu.rejected_kernels) == {}  # cpu_interpreter comes first


def test_failed_kernel_falls_back_to_portable():
    got = plan(failed={"gluon_seesaw": "RuntimeError('no warp_specialize here')"})
    assert got.kernel == "portable" and got.kernel_row == got.tuning_row == "sm90_default"
    assert got.fallback == ("gluon_seesaw (row sm90_bf16_gluon_seesaw) failed to compile here: "
                            "RuntimeError('no warp_specialize here')")
    assert attrs.evolve(got, fallback=None) == attrs.evolve(plan(), kernel="portable", kernel_row="sm90_default",
                                                            kernel_why=got.why, per_call=None)
    other = plan(failed={"gluon_fp8": "boom"})  # another kernel's failure changes nothing here
    assert other.kernel == "gluon_seesaw" and other.fallback is None
    fp8_failed = plan(num_tokens=2, kv_dtype="fp8_e4m3", num_heads=16, failed={"gluon_fp8": "boom"})
    assert fp8_failed.kernel == "portable" and fp8_failed.fallback.startswith("gluon_fp8 (row sm90_fp8_gluon)")
    assert plan(num_tokens=2, kv_dtype="fp8_e4m3", num_heads=64,
                failed={"gluon_fp8": "boom"}).fallback is None  # the seesaw anyway (64 heads)


def test_unknown_sm_count_leaves_splits_and_kernel_open():
    got = plan(num_sms=None)
    assert (got.num_kv_splits, got.ids_per_split, got.kernel) == (None, None, "portable")
    assert got.tuning_row == "sm90_default" and got.kernel_row == "sm90_default" and got.block_h == 64
    assert any(label.startswith("gluon_fp8") and why.startswith("num_kv_splits=None, needs >= 1")
               for label, why in got.rejected_kernels)
    forced = plan(num_sms=None, num_kv_splits=1)  # a forced count needs no SM count
    assert (forced.num_kv_splits, forced.kernel) == (1, "gluon_seesaw")


def test_launch_record_fields():
    got = plan(num_heads=5, num_tokens=256)
    assert got.block_h == 16 and got.combine_block_h == 16 and got.combine_block_d == 128
    assert (got.block_n, got.num_warps, got.num_stages, got.fp8_f16) == (64, 4, 2, True)
    assert plan(arch="cpu", num_sms=1, num_heads=5).combine_block_d == 512
    assert plan(kv_dtype="fp8_e4m3", num_heads=128).fp8_f16 is False  # the sm90_fp8 row
    hand_config = P.TritonConfig(block_h=64, block_n=16, num_warps=4, num_stages=1, max_kv_splits=32,
                                 min_ids_per_split=64, split_waves=1.0, split_min_fill=0.5, combine_block_h=64,
                                 combine_block_d=512, min_combine_block_d=32, fp8_f16=True)
    hand = P.portable_launch(hand_config, num_heads=5, num_tokens=3, topk=37, num_sms=None, num_kv_splits=3)
    assert (hand.tuning_row, hand.block_h, hand.combine_block_h, hand.num_kv_splits, hand.ids_per_split) == (
        "explicit", 16, 16, 3, 16)
    with pytest.raises(ValueError, match="'kernel' must be in"):
        attrs.evolve(got, kernel="cuda_graph_magic")
    with pytest.raises(ValueError, match="q_dtype"):
        plan(q_dtype="fp32")


# ---- the table -----------------------------------------------------------------------------------------

def _shipped_text():
    return table_path("triton_tuning").read_text()


def test_tuning_table_is_proven_at_load():
    P.tuning_table.cache_clear()
    table = P.tuning_table()
    assert dispatch.check_table(table) == []
    assert tuple(table.paths) == P.KERNELS
    # the checker walks the product of the domains: small enough to run at every load (192,000 combinations since
    # topk became a field, two values; 768,000 since the stride facts gather_aligned and unit_rows, two bools: a
    # bitset check, the whole load 54 ms before and after them, forty-second session; 1,152,000 since topk's domain
    # starts at its least legal value, 1, so the threshold check sees below 1000: 54 and 56 ms, forty-third session)
    assert dispatch.grid.Grid(table.fields).size <= 1_200_000


def test_tuning_table_load_refuses_a_shadowed_gluon_row_or_a_gap(monkeypatch, tmp_path):
    text = _shipped_text()
    start = text.index("  - id: sm90_bf16_gluon_seesaw")
    end = text.index("  - id: sm90_fp16_gluon_seesaw")
    path = tmp_path / "triton_tuning.yaml"
    monkeypatch.setattr(core_tables, "table_path", lambda name: path)  # the loader every table shares
    try:
        path.write_text(text[:start] + text[end:] + text[start:end])  # after the row it overrides: never wins
        P.tuning_table.cache_clear()
        with pytest.raises(dispatch.TableCheckError, match="sm90_bf16_gluon_seesaw.*shadowed"):
            P.tuning_table()
        path.write_text(text[:text.index("  - id: any_gpu_fallback")])  # unknown GPUs get no row
        P.tuning_table.cache_clear()
        with pytest.raises(dispatch.TableCheckError, match="gap"):
            P.tuning_table()
    finally:
        P.tuning_table.cache_clear()


@pytest.mark.parametrize("edit,message", [
    (("    when: {arch: sm90, num_heads: {le: 16}}\n",
      "    when: {arch: sm90, num_heads: {le: 16}, num_kv_splits: 1}\n"), "must not test num_kv_splits"),
    (("      num_kv_splits: {ge: 1, because: \"the split count is planned first (the portable row's split policy); every",
      "      num_heads: {ge: 1, because: \"the split count is planned first (the portable row's split policy); every"),
     "must need a split count"),
    (("combine_block_d: 512, min_combine_block_d: 32, fp8_f16: true}",
      "combine_block_d: 512, min_combine_block_d: 32}"), "missing \\['fp8_f16'\\]"),
    (("combine_block_d: 512, min_combine_block_d: 32,", "combine_block_d: 512,"),
     "missing \\['min_combine_block_d'\\]"),
    (("    path: gluon_fp8\n    why: e4m3fn", "    path: gluon_fp8\n    params: {BLOCK_H: 16}\n    why: e4m3fn"),
     "takes no params"),
    (("      topk: {multiple_of: 16, because:", "      topk: {ge: 1, because:"),
     "path 'gluon_seesaw' must require topk: \\{multiple_of: N\\} once .*got 0"),
    (("      topk: {multiple_of: 16, because:", "      topk: {multiple_of: 16, ge: 2, because:"),
     None),  # other conditions on topk beside the one multiple: allowed
])
def test_structure_check_refuses(edit, message):
    text = _shipped_text()
    assert text.count(edit[0]) == 1
    table = dispatch.load_table(text.replace(*edit), name="edited.yaml")
    if message is None:
        P._check_structure(table)
        return
    with pytest.raises(dispatch.TableError, match=message):
        P._check_structure(table)


# ---- the seesaw's topk rule is the table's (tables/triton_tuning.yaml, path gluon_seesaw, requires topk) ----------

SEESAW_TOPK = '      topk: {multiple_of: 16, because:'


def test_the_seesaw_takes_a_topk_by_its_paths_multiple_of_requirement():
    """A topk that is not a multiple of 16 fails the gluon_seesaw path's requirement: the seesaw rows are rejected
    (one entry naming them, with the table's reason), the portable row that gave the tiles names the kernel, and no
    fallback is claimed; a multiple of 16 takes the seesaw. With the split count open the same requirement is shown
    beside the split count's."""
    assert P.seesaw_stride_multiple() == 16
    for topk in (1000, 2047, 2049, 37):
        got = plan(num_heads=128, num_tokens=4, topk=topk)
        assert (got.kernel, got.kernel_row, got.fallback) == ("portable", got.tuning_row, None), topk
        (seesaw,) = [(label, why) for label, why in got.rejected_kernels if label.startswith("gluon_seesaw (")]
        assert "sm90_bf16_gluon_seesaw" in seesaw[0]
        assert seesaw[1].startswith(f"topk={topk}, needs a multiple of 16 (the seesaw gathers with strides"), seesaw
    for topk in (16, 1008, 1024, 2048):
        assert plan(num_heads=128, num_tokens=4, topk=topk).kernel == "gluon_seesaw", topk
    # gluon_fp8 has no such requirement: e4m3 and V3.2 rows at <= 32 heads take it at any topk
    assert plan(kv_dtype="fp8_e4m3", num_heads=16, topk=1000).kernel == "gluon_fp8"
    assert plan(kv_dtype="fp8_ds_mla", num_heads=32, topk=2047).kernel == "gluon_fp8"
    open_splits = dict(plan(num_sms=None, topk=1000).rejected_kernels)
    (label,) = [k for k in open_splits if k.startswith("gluon_seesaw (")]
    assert "num_kv_splits=None, needs >= 1" in open_splits[label] and "topk=1000, needs a multiple of 16" in \
        open_splits[label]


@pytest.mark.parametrize("multiple,topk,kernel", [
    (8, 1000, "gluon_seesaw"),  # 1000 = 8 x 125: the edited table lets the seesaw take it
    (16, 1000, "portable"),
    (32, 2000, "portable"),  # 2000 = 16 x 125: the shipped table's seesaw call, refused by the edited one
    (16, 2000, "gluon_seesaw"),
    (1, 2047, "gluon_seesaw"),
])
def test_an_edited_multiple_changes_the_routing(edited_tuning_table, multiple, topk, kernel):
    """The number lives in the table only: an edited copy of it moves the boundary of the plan and of the launcher's
    stride check alike (:func:`mla_sink.paths.triton.plan.seesaw_strides_ok` on contiguous indices ``[T, topk]``,
    which the seesaw launcher checks against its plan; contiguous tensors are always ``CallSpec.gather_aligned``)."""
    import torch

    from mla_sink.core.inputs import DecodeInputs

    edited_tuning_table(SEESAW_TOPK, f"      topk: {{multiple_of: {multiple}, because:")
    assert P.seesaw_stride_multiple() == multiple
    got = plan(num_heads=128, num_tokens=4, topk=topk)
    assert got.kernel == kernel, got
    x = DecodeInputs(q=torch.zeros(4, 128, 576, dtype=torch.bfloat16), kv_cache=torch.zeros(8, 576, dtype=torch.bfloat16),
                     indices=torch.zeros(4, topk, dtype=torch.int32), sm_scale=1.0)
    assert P.seesaw_strides_ok(x.q, x.kv_cache, x.indices) == (kernel == "gluon_seesaw")
    assert P.gather_strides_aligned(x.q, x.kv_cache, x.indices)  # contiguous: the topk requirement decides


CPU_PARAMS = ("{BLOCK_H: 64, BLOCK_N: 64, num_warps: 4, num_stages: 1, max_kv_splits: 4,\n"
              "             min_ids_per_split: 64, split_waves: 1.0, split_min_fill: 1.0, combine_block_h: 64,\n"
              "             combine_block_d: 512, min_combine_block_d: 32, fp8_f16: true}")


@pytest.mark.parametrize("old,new,message", [
    ("BLOCK_N: 64,", "BLOCK_N: 0,", "param 'BLOCK_N' must be a power of two in [16, "),
    ("BLOCK_N: 64,", "BLOCK_N: 48,", "param 'BLOCK_N' must be a power of two in [16, "),
    ("BLOCK_N: 64,", "BLOCK_N: '64',", "param 'BLOCK_N' must be a power of two in [16, "),
    ("BLOCK_N: 64,", "BLOCK_N: 64.0,", "param 'BLOCK_N' must be a power of two in [16, "),
    ("BLOCK_H: 64,", "BLOCK_H: 48,", "param 'BLOCK_H' must be a power of two"),
    ("BLOCK_N: 64,", "BLOCK_N: 4096,", "param 'BLOCK_N' must be a power of two in [16, 256]"),
    ("BLOCK_H: 64,", "BLOCK_H: 512,", "param 'BLOCK_H' must be a power of two in [16, 256]"),
    ("num_stages: 1,", "num_stages: 9,", "param 'num_stages' must be an int in [1, 8]"),
    ("combine_block_h: 64,", "combine_block_h: 1024,", "param 'combine_block_h' must be a power of two in [1, 256]"),
    ("num_warps: 4,", "num_warps: 3,", "param 'num_warps' must be a power of two in [1, 32]"),
    ("num_stages: 1,", "num_stages: 0,", "param 'num_stages' must be an int in [1, "),
    ("max_kv_splits: 4,", "max_kv_splits: -1,", "param 'max_kv_splits' must be an int in [1, "),
    ("min_ids_per_split: 64,", "min_ids_per_split: 0,", "param 'min_ids_per_split' must be an int in [1, "),
    ("split_waves: 1.0,", "split_waves: .inf,", "param 'split_waves' must be a finite number > 0.0"),
    ("split_waves: 1.0,", "split_waves: .nan,", "param 'split_waves' must be a finite number > 0.0"),
    ("split_waves: 1.0,", "split_waves: 0,", "param 'split_waves' must be a finite number > 0.0"),
    ("split_min_fill: 1.0,", "split_min_fill: -0.5,", "param 'split_min_fill' must be a finite number >= 0.0"),
    ("combine_block_h: 64,", "combine_block_h: null,", "param 'combine_block_h' must be a power of two"),
    ("combine_block_d: 512,", "combine_block_d: 1024,", "param 'combine_block_d' must be a power of two in [1, 512]"),
    ("combine_block_d: 512,", "combine_block_d: 0,", "param 'combine_block_d' must be a power of two in [1, 512]"),
    ("min_combine_block_d: 32,", "min_combine_block_d: 24,", "param 'min_combine_block_d' must be a power of two"),
    ("combine_block_d: 512,", "combine_block_d: 16,", "param 'min_combine_block_d' must be <= combine_block_d=16"),
    ("fp8_f16: true}", "fp8_f16: 'yes'}", "param 'fp8_f16' must be true or false (got 'yes')"),
    ("fp8_f16: true}", "fp8_f16: yes}", "param 'fp8_f16' must be true or false (got 'yes')"),
])
def test_tuning_params_are_checked_when_the_table_loads(old, new, message):
    """A portable row's params are typed and ranged at load (a break test, thirty-third session: ``BLOCK_N: 0`` and
    ``min_ids_per_split: 0`` raised ZeroDivisionError at the first call, ``split_waves: .nan`` a bare conversion
    error, ``num_warps: 3`` and ``combine_block_d: 500`` loaded and ran): the error names file, line, row, param."""
    text = _shipped_text()
    assert text.count(CPU_PARAMS) == 1
    table = dispatch.load_table(text.replace(CPU_PARAMS, CPU_PARAMS.replace(old, new, 1)), name="edited.yaml")
    line = text[:text.index("  - id: cpu_interpreter")].count("\n") + 1
    with pytest.raises(dispatch.TableError, match=rf"^edited\.yaml:{line}: row 'cpu_interpreter': " + re.escape(message)):
        P._check_structure(table)


def test_the_combine_narrows_its_columns_down_to_the_rows_min_combine_block_d():
    """T=1 at H=128 on 132 SMs: 16 x 128 tiles give 32 programs, 16 x 32 tiles 128 (still fewer than the SMs):
    the row's floor (32) stops the halving there, and a config's own floor wherever it says."""
    assert plan(num_tokens=1).combine_block_d == 32
    cfg = attrs.evolve(P.triton_config("sm90", "bf16", "bf16", 128, 1, topk=2048), min_combine_block_d=64)
    assert P.combine_block_d_for(cfg, 1, 128, 132) == 64
    assert P.combine_block_d_for(attrs.evolve(cfg, min_combine_block_d=16), 1, 128, 132) == 16
    assert P.combine_block_d_for(cfg, 1, 128, None) == 128


def test_dcp_merge_table_is_proven_at_load_and_gives_the_merge_tile():
    """The DCP merge's tile (tables/dcp_merge.yaml): every head and column in one program on the CPU interpreter,
    16 x 128 on every GPU (an arch the domain does not name included)."""
    P.dcp_merge_table.cache_clear()
    assert dispatch.check_table(P.dcp_merge_table()) == []
    assert [P.dcp_merge_tile("cpu", h) for h in (1, 17, 128, 200)] == [(16, 512), (32, 512), (128, 512), (256, 512)]
    for arch in ("sm90", "sm80", "gfx942", "sm120"):
        assert [P.dcp_merge_tile(arch, h) for h in (1, 17, 128)] == [(16, 128)] * 3


@pytest.mark.parametrize("edit,message", [
    (("{combine_block_h: 16, combine_block_d: 128}", "{combine_block_h: 16}"), "exactly the params"),
    (("{combine_block_h: 16, combine_block_d: 128}", "{combine_block_h: 8, combine_block_d: 128}"), "got .*: 8"),
    (("{combine_block_h: 16, combine_block_d: 128}", "{combine_block_h: 16, combine_block_d: 96}"), "got .*: 96"),
])
def test_dcp_merge_table_check_refuses(edit, message):
    text = table_path("dcp_merge").read_text()
    assert text.count(edit[0]) == 1
    table = dispatch.load_table(text.replace(*edit), name="edited.yaml")
    with pytest.raises(dispatch.TableError, match=f"edited.yaml:\\d+: row 'any_gpu': .*{message}"):
        P._check_merge_rows(table)


def test_first_lookup_is_always_portable_and_second_finds_it_again():
    """Over the whole grid: no Gluon row matches with the split count open, and portable rows never test it."""
    table = P.tuning_table()
    grid = dispatch.grid.Grid(table.fields)
    splits_open = grid.field_mask("num_kv_splits", [dispatch.Condition("num_kv_splits", "present", False, "int")])
    assert splits_open
    for row in table.rows:
        if row.path != P.PORTABLE:  # a row's conditions and its path's requirements both hold when it wins
            assert not grid.mask((*row.when, *table.paths[row.path].requires)) & splits_open, row.id
        else:
            assert all(c.field != "num_kv_splits" for c in row.when), row.id


@pytest.mark.interpreter
@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_forced_split_count_is_checked(bad):
    import torch

    from mla_sink.paths.triton.launch import sparse_mla_decode_triton

    q = torch.zeros(1, 4, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="'num_kv_splits' must be None or an int >= 1"):
        sparse_mla_decode_triton(q, torch.zeros(8, 576, dtype=torch.bfloat16), torch.zeros(1, 8, dtype=torch.int32),
                                 num_kv_splits=bad)


@pytest.mark.parametrize("bad", ["bogus", "gluon_fp8", ""])
def test_a_forced_kernel_other_than_portable_is_refused(bad):
    """``kernel`` forces the portable kernel or nothing: a misspelt name was ignored and the table's kernel ran (a
    break test, fortieth session)."""
    import torch

    from mla_sink.paths.triton.launch import sparse_mla_decode_triton

    q = torch.zeros(1, 4, 576, dtype=torch.bfloat16)
    text = rf"'kernel' must be None \(the tuning table's kernel\) or 'portable' \(got {bad!r}\)"
    with pytest.raises(ValueError, match=text):
        sparse_mla_decode_triton(q, torch.zeros(8, 576, dtype=torch.bfloat16), torch.zeros(1, 8, dtype=torch.int32),
                                 kernel=bad)
