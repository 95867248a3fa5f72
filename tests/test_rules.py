"""The shipped rule table: (CallSpec, Platform) -> expected path and params, or refusal text.

Explicit platforms on the CPU; no mocks of hardware. Every row of tables/mla_decode.yaml is the
winner of at least one case below (checked by test_every_row_is_exercised).
"""

from __future__ import annotations

import re

import attrs
import pytest

from mla_sink import dispatch
from mla_sink import CallSpec, NoKernelError, Platform, call_key, plan_call, select
from mla_sink.core.select import KNOWN_PATHS, mla_table

G942 = Platform("gfx942", "0.1.20")
G950 = Platform("gfx950", "0.1.20")
FNUZ, OCP = "fp8_e4m3fnuz", "fp8_e4m3"
DS = "fp8_ds_mla"  # the 656-byte V3.2 rows


def spec(q="bf16", kv=None, h=16, sinks=False, dcp=1, lse=False, cap=0.0, topk=2048, packed=True):
    return CallSpec(q_dtype=q, kv_dtype=kv or q, num_heads=h, topk=topk, sinks=sinks, dcp_world_size=dcp,
                    need_lse=lse, logit_cap=cap, kv_rows_packed=packed)


# (spec, platform, expected path, expected params subset, expected row id)
CASES = [
    (spec(h=32, sinks=True), G950, "aiter_lse_single_split", {"num_kv_splits": 1, "pad_heads_to": 16},
     "gfx950_bf16_h32_lse_single_split"),
    # at least two splits: with one, these bf16 kernels write no LSE (fortieth session's review of AITER)
    (spec(h=64, sinks=True), G950, "aiter_lse", {"min_kv_splits": 2}, "aiter_lse_bf16_gfx950"),
    (spec(h=128, sinks=True), G942, "aiter_lse", {"min_kv_splits": 2}, "aiter_lse_bf16_gfx942"),
    (spec(h=32, dcp=2), G942, "aiter_lse", {"min_kv_splits": 2}, "aiter_lse_bf16_gfx942"),
    (spec(h=64, sinks=True), Platform("gfx942", "0.1.20", triton=False), "reference", {}, "reference_without_triton"),
    (spec(h=40, sinks=True), G950, "aiter_persistent", {"return_lse": True}, "gfx950_bf16_lse_persistent"),
    (spec(h=64), Platform("gfx942", "0.1.15"), "triton", {}, "triton_portable"),
    (spec(h=5, sinks=True), G942, "aiter_lse", {"pad_heads_to": 16}, "aiter_lse_bf16_small_heads"),
    (spec(FNUZ, h=16, sinks=True), G942, "aiter_lse_fp8_two_split", {"min_kv_splits": 2, "pad_heads_to": 16},
     "gfx942_fp8_lse_two_split_h16"),
    (spec(FNUZ, h=128, sinks=True), G942, "aiter_lse_fp8_two_split", {"min_kv_splits": 2}, "gfx942_fp8_lse_two_split_h128"),
    (spec(FNUZ, h=64, sinks=True), G942, "aiter_persistent", {"return_lse": True}, "gfx942_fp8_h64_q1_persistent_lse"),
    (spec(FNUZ, h=32, sinks=True), G942, "triton", {}, "triton_portable"),
    (spec(OCP, h=64, sinks=True), G950, "aiter_persistent", {"return_lse": True}, "gfx950_fp8_persistent_lse"),
    # the 32-head LSE kernel writes none for unsplit work: 17-32 heads padded to the 64-head one (fortieth session)
    (spec(OCP, h=24, sinks=True), G950, "aiter_persistent", {"return_lse": True, "pad_heads_to": 64},
     "gfx950_fp8_h32_persistent_lse_padded_64"),
    (spec(h=24, sinks=True), G950, "aiter_persistent", {"return_lse": True}, "gfx950_bf16_lse_persistent"),
    (spec(h=64, sinks=True), G942, "triton", {}, "triton_portable"),  # MI300: no bf16 LSE kernel for 64 heads
    (spec(h=48, dcp=2), G942, "triton", {}, "triton_portable"),
    (spec("fp16", h=16, sinks=True), G942, "triton", {}, "triton_portable"),  # AITER paths require q_dtype != fp16
    (spec("fp16", h=16), G950, "triton", {}, "triton_portable"),
    (spec(h=64), G942, "aiter_persistent",
     {"return_lse": False, "pad_heads_to": 16, "pad_heads_multiple": 16, "max_split_per_batch": 32}, "aiter_persistent_bf16"),
    (spec(h=16), G950, "aiter_persistent", {"return_lse": False}, "aiter_persistent_bf16"),
    (spec(FNUZ, h=32), G942, "aiter_persistent", {"return_lse": False}, "aiter_persistent_fp8_gfx942"),
    (spec(OCP, h=32), G950, "aiter_persistent", {"return_lse": False}, "aiter_persistent_fp8_gfx950"),
    # AITER_ENABLE_EXPERIMENTAL: fp8 persistent calls of 64 / 128 query rows run hk_mla_decode_fwd (no scales, no
    # final_lse) from 0.1.20, so fp8 persistent rows require it off; gfx942's 64-head kernel is not hk's, bf16 never
    (spec(FNUZ, h=128), attrs.evolve(G942, aiter_experimental=True), "triton", {}, "triton_portable"),
    (spec(OCP, h=64, sinks=True), attrs.evolve(G950, aiter_experimental=True), "triton", {}, "triton_portable"),
    (spec(OCP, h=24, sinks=True), attrs.evolve(G950, aiter_experimental=True), "triton", {}, "triton_portable"),
    (spec(FNUZ, h=64, sinks=True), attrs.evolve(G942, aiter_experimental=True), "aiter_persistent",
     {"return_lse": True}, "gfx942_fp8_h64_q1_persistent_lse"),
    (spec(h=16, sinks=True), attrs.evolve(G950, aiter_experimental=True), "aiter_lse", {},
     "aiter_lse_bf16_small_heads"),
    (spec(h=256), G942, "triton", {}, "triton_portable"),  # AITER paths require num_heads <= 128
    (spec(h=16, cap=30.0), G942, "triton", {}, "triton_portable"),  # AITER paths require logit_cap <= 0
    # AITER paths require packed kv_cache rows (a [N, 576] view of rows of 640 was refused by the AITER launcher
    # at run time while explain named AITER)
    (spec(h=16, sinks=True, packed=False), G942, "triton", {}, "triton_portable"),
    (spec(h=64, packed=False), G950, "triton", {}, "triton_portable"),
    (spec(FNUZ, h=64, sinks=True, packed=False), G942, "triton", {}, "triton_portable"),
    (spec(h=32, sinks=True, packed=False), Platform("gfx950", "0.1.20", triton=False), "reference", {},
     "reference_without_triton"),
    (spec(h=128, sinks=True, packed=False), Platform("sm90"), "triton", {}, "triton_portable"),
    (spec(h=32, sinks=True), Platform("gfx942", "0.1.15"), "triton", {}, "triton_portable"),
    (spec(h=32, sinks=True), Platform("gfx950", "0.1.18"), "triton", {}, "triton_portable"),
    (spec(h=32, sinks=True), Platform("gfx942", None), "triton", {}, "triton_portable"),  # AITER absent
    (spec(h=64), Platform("gfx950", None), "triton", {}, "triton_portable"),
    (spec(h=128, sinks=True), Platform("sm90"), "triton", {}, "triton_portable"),
    (spec(OCP, h=16), Platform("sm90"), "triton", {}, "triton_portable"),
    (spec(FNUZ, h=16, sinks=True), Platform("sm90"), "triton", {}, "triton_portable"),
    (spec("bf16", OCP, h=16), Platform("sm80", triton=False), "reference", {}, "reference_without_triton"),
    (spec("bf16", OCP, h=16, sinks=True), Platform("sm100"), "triton", {}, "triton_portable"),
    (spec(h=16, sinks=True), Platform("cpu"), "triton", {}, "triton_portable"),
    (spec(h=16, sinks=True), Platform("cpu", triton=False), "reference", {}, "reference_without_triton"),
    (spec(h=128, sinks=True), Platform("gfx942", None, triton=False), "reference", {}, "reference_without_triton"),
    (spec(h=16, sinks=True), Platform("gfx90a", "0.1.20"), "triton", {}, "triton_portable"),
    # the 656-byte V3.2 layout: the portable kernel everywhere; on AMD through the row that says why no
    # AITER kernel takes it (mla_decode_fwd_ds32 on gfx950 needs split E8M0 buffers and fp8 q; gfx942's
    # byte-KV kernel reads a page-planar layout and writes no LSE)
    (spec("bf16", DS, h=128, sinks=True), Platform("sm90"), "triton", {}, "triton_portable"),
    (spec("fp16", DS, h=16), Platform("sm100"), "triton", {}, "triton_portable"),
    (spec("bf16", DS, h=64, sinks=True), G950, "triton", {}, "fp8_ds_mla_amd_triton"),
    (spec("bf16", DS, h=128, sinks=True), G950, "triton", {}, "fp8_ds_mla_amd_triton"),  # ds32's head count
    (spec("bf16", DS, h=128), G950, "triton", {}, "fp8_ds_mla_amd_triton"),  # without an LSE too
    (spec("fp16", DS, h=32, dcp=2), Platform("gfx950", None), "triton", {}, "fp8_ds_mla_amd_triton"),
    (spec("bf16", DS, h=16), G942, "triton", {}, "fp8_ds_mla_amd_triton"),  # the byte-KV kernel's head count
    (spec("bf16", DS, h=16, sinks=True), G942, "triton", {}, "fp8_ds_mla_amd_triton"),
    (spec("bf16", DS, h=128, sinks=True), Platform("gfx950", "0.1.20", triton=False), "reference", {},
     "reference_without_triton"),
    (spec("bf16", DS, h=16, sinks=True), Platform("cpu"), "triton", {}, "triton_portable"),
    (spec("bf16", DS, h=16), Platform("cpu", triton=False), "reference", {}, "reference_without_triton"),
]

REFUSALS = [
    (spec(FNUZ, h=16), Platform("sm80"), "fp8_needs_sm89", "sm89"),
    (spec("bf16", OCP, h=16), Platform("sm80"), "fp8_needs_sm89", "sm89"),
    (spec("bf16", DS, h=16), Platform("sm80"), "fp8_needs_sm89", "sm89"),
]


@pytest.mark.parametrize("s,p,path,params,row", CASES, ids=[call_key(c[0], c[1]) for c in CASES])
def test_rule_table_choice(s, p, path, params, row):
    sel = select(s, p)
    assert (sel.path, sel.row.id) == (path, row), dispatch.explain(sel)
    assert {k: sel.params[k] for k in params} == params
    plan = plan_call(s, p)
    assert plan.path == path and plan.row_id == row


@pytest.mark.parametrize("s,p,row,text", REFUSALS, ids=[call_key(c[0], c[1]) for c in REFUSALS])
def test_rule_table_refusal(s, p, row, text):
    sel = select(s, p)
    assert sel.refused and sel.row.id == row
    with pytest.raises(NoKernelError, match=text) as info:
        plan_call(s, p)
    assert call_key(s, p) in str(info.value)


def test_every_row_is_exercised():
    exercised = {c[4] for c in CASES} | {r[2] for r in REFUSALS}
    assert {r.id for r in mla_table().rows} == exercised


@pytest.mark.parametrize("case", [c for c in CASES if c[2].startswith("aiter")], ids=lambda c: c[4])
def test_no_aiter_path_serves_a_pool_past_4_gib(case):
    """Every call an AITER row serves keeps its path on a pool of exactly 2^32 bytes and leaves AITER for Triton (the
    reference without Triton) one byte past it: AITER's kernels address rows by a 32-bit byte offset from the pool's
    first byte (ROCm/aiter#5765). The refusal names the bound, as every AITER path's requirement."""
    import attrs

    s, p, path, _, row = case
    assert select(attrs.evolve(s, kv_cache_bytes=2 ** 32), p).path == path
    for triton, portable in ((p.triton, "triton"), (False, "reference")):
        platform = attrs.evolve(p, triton=triton)
        sel = select(attrs.evolve(s, kv_cache_bytes=2 ** 32 + 1), platform)
        assert sel.path == (portable if triton else "reference"), (row, triton)
        assert path in sel.path_failures, (row, sel)
        assert any(f.field == "kv_cache_bytes" and f.actual == 2 ** 32 + 1 for f in sel.path_failures[path]), sel


def test_every_aiter_path_requires_the_aiter_facts_once():
    """The facts every AITER call needs are the AITER paths' requirements, not rows: no row restates them
    (the checker reports a row condition its path already implies), and all four paths share them."""
    table = mla_table()
    aiter = [p for p in table.paths if p.startswith("aiter")]
    wanted = {("arch", "in"), ("aiter_version", "present"), ("aiter_version", "at_least"), ("q_dtype", "ne"),
              ("kv_dtype", "ne"), ("logit_cap", "le"), ("num_heads", "le"), ("kv_rows_packed", "eq"),
              ("kv_cache_bytes", "le")}
    for name in aiter:
        assert {(c.field, c.op) for c in table.paths[name].requires} == wanted, name
        assert table.paths[name].requires == table.paths[aiter[0]].requires
        assert table.paths[name].params["pad_heads_to"] == 16  # AITER never pads heads below 16
    assert table.paths["aiter_persistent"].params["pad_heads_multiple"] == 16
    assert not [p for p in dispatch.check_table(table) if p.kind.startswith("redundant")]
    for row in table.rows:
        if row.path and row.path.startswith("aiter"):
            assert not {c.field for c in row.when} & {"aiter_version", "logit_cap"}, row.id


@pytest.mark.parametrize("s,p,text", [
    (spec("fp16", h=16, sinks=True), G942, "q_dtype=fp16, needs not fp16 (fp16 q aborts"),
    (spec(h=16, cap=30.0), G942, "logit_cap=30.0, needs <= 0.0"),
    (spec(h=256), G950, "num_heads=256, needs <= 128"),
    (spec(h=32, sinks=True), Platform("gfx942", None), "aiter_version=None, needs a value (AITER not importable)"),
    (spec(h=32, sinks=True), Platform("gfx942", "0.1.15"), "aiter_version=0.1.15, needs >= 0.1.19"),
    (spec("bf16", "fp8_ds_mla", h=128, sinks=True), G950, "kv_dtype=fp8_ds_mla, needs not fp8_ds_mla (mla_decode_fwd reads"),
])
def test_aiter_path_requirement_is_the_stated_reason(s, p, text):
    """The negative rows are gone: the AITER paths' requirements say why Triton serves the call, once."""
    sel = select(s, p)
    assert sel.path == "triton"
    said = {name: "; ".join(dispatch.statements(f)) for name, f in sel.path_failures.items()}
    assert set(said) == {"aiter_persistent", "aiter_lse", "aiter_lse_single_split", "aiter_lse_fp8_two_split"}
    assert all(text in t for t in said.values()), said
    lines = [ln for ln in dispatch.explain(sel).splitlines() if text in ln]
    assert len(lines) == 1 and lines[0].startswith("  ✗ paths aiter_persistent (rows "), lines


def test_shipped_table_passes_checker():
    problems = dispatch.check_table(mla_table())
    assert problems == [], "\n".join(map(str, problems))


def test_table_paths_are_the_launchable_paths():
    from mla_sink.paths import LAUNCHERS

    assert set(mla_table().paths) == set(KNOWN_PATHS) == set(LAUNCHERS)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_no_lse_path_never_serves_sinks_or_dcp(arch):
    for h in (8, 16, 24, 32, 48, 64, 128):
        for q in ("bf16", FNUZ if arch == "gfx942" else OCP):
            for kw in ({"sinks": True}, {"dcp": 2}, {"lse": True}):
                sel = select(spec(q, h=h, **kw), Platform(arch, "0.1.20"))
                assert sel.params.get("return_lse") is not False, (h, q, kw, sel.row.id)


@pytest.mark.parametrize("arch", ["gfx942", "sm90", "cpu"])
def test_aiter_absent_reason_is_stated(arch):
    sel = select(spec(h=32, sinks=True), Platform(arch, None))
    aiter_rows = [(row, fails) for row, fails in sel.rejected if row.path and row.path.startswith("aiter")]
    assert aiter_rows, [row.id for row, _ in sel.rejected]  # the AITER rows come first: each was rejected here
    for row, fails in aiter_rows:
        assert any("AITER not importable" in str(f) for f in fails), (row.id, fails)


def test_old_aiter_is_not_given_lse_path():
    sel = select(spec(h=32, sinks=True), Platform("gfx942", "0.1.15"))
    assert not sel.path.startswith("aiter")
    text = dispatch.explain(sel)
    assert "aiter_version=0.1.15" in text and "0.1.19" in text


def test_dcp_explains_why_persistent_is_rejected():
    sel = select(spec(h=64, dcp=2), Platform("gfx950", "0.1.20"))
    assert sel.path == "aiter_lse"
    rejected = {row.id: " ".join(map(str, fails)) for row, fails in sel.rejected}
    assert "need_lse=true" in rejected["aiter_persistent_bf16"]
    assert "writes no LSE" in rejected["aiter_persistent_bf16"]


def test_forced_path_that_cannot_serve_is_refused_with_reason():
    with pytest.raises(NoKernelError, match="writes no LSE"):
        plan_call(spec(h=64, dcp=2), Platform("gfx942", "0.1.20"), path="aiter_persistent")


def test_forced_unknown_path_is_value_error():
    with pytest.raises(ValueError, match="'path' must be one of"):
        select(spec(), Platform("cpu"), path="cuda_magic")


SWEEP_PLATFORMS = [G942, G950, Platform("gfx942", "0.1.15"), Platform("gfx950", None), Platform("sm90"),
                   Platform("sm80"), Platform("cpu"), Platform("cpu", triton=False)]
SWEEP_DTYPES = [("bf16", "bf16"), ("fp16", "fp16"), (FNUZ, FNUZ), (OCP, OCP), ("bf16", OCP), ("bf16", DS)]


@pytest.mark.parametrize("p", SWEEP_PLATFORMS, ids=str)
def test_explain_states_each_mismatch_and_reason_once(p):
    """Over heads, dtypes, sinks and caps: every rejection line states each field once, every `because` is
    written once in the whole explanation, and a path whose requirements fail is one line, not one per row."""
    for q, kv in SWEEP_DTYPES:
        for h in (8, 16, 32, 64, 128, 256):
            for kw in ({}, {"sinks": True}, {"cap": 30.0}):
                sel = select(spec(q, kv, h=h, **kw), p)
                text = dispatch.explain(sel)
                rejected = [ln for ln in text.splitlines() if ln.lstrip().startswith("✗") and ": " in ln]
                for ln in rejected:
                    said = ln.split(": ", 1)[1].split("; ")
                    fields = [part.split("=", 1)[0] for part in said if "=" in part.split(",")[0]]
                    assert len(fields) == len(set(fields)), ln
                for row in mla_table().rows:
                    for cond in row.when:
                        if cond.because:
                            assert text.count(cond.because) <= 1, (cond.because, text)
                for spec_ in mla_table().paths.values():
                    for cond in spec_.requires:
                        assert text.count(f"({cond.because})") <= 1, (cond.because, text)
                path_lines = [ln for ln in rejected if ln.startswith("  ✗ path")]
                assert len(path_lines) <= 1, text  # the four AITER paths fail alike, so they share a line
                grouped = {rid for r, _ in sel.rejected if r.path in sel.path_failures for rid in [r.id]}
                for rid in grouped:
                    assert not any(ln.startswith(f"  ✗ {rid}:") for ln in rejected), (rid, text)
                    assert rid in path_lines[0]


def test_heads_padded_to_the_paths_bound_load(tmp_path):
    """Padding to exactly what the path takes loads: 121 heads round up to 128 (the multiple of 16), the bound."""
    from mla_sink import dispatch
    from mla_sink.core.tables import table_path
    from mla_sink.paths.aiter.plan import check_mla_params

    source = open(table_path("mla_decode")).read()
    path = tmp_path / "mla_decode.yaml"
    path.write_text(source.replace("params: {return_lse: true, pad_heads_to: 64}",
                                   "params: {return_lse: true, pad_heads_to: 121}"))
    check_mla_params(dispatch.load_table(str(path)))
    path.write_text(source.replace("params: {return_lse: true, pad_heads_to: 64}",
                                   "params: {return_lse: true, pad_heads_to: 129}"))
    with pytest.raises(dispatch.TableError, match="pads every call to 144 heads"):
        check_mla_params(dispatch.load_table(str(path)))


@pytest.mark.parametrize("old,new,text", [
    # a misspelt param was ignored: the fp8 path then let AITER pick one split, whose LSE is never written
    ("params: {pad_heads_to: 16, min_kv_splits: 2}", "params: {pad_heads_to: 16, min_kv_split: 2}",
     "path 'aiter_lse_fp8_two_split' (its default params, for row 'gfx942_fp8_lse_two_split_h16'): path "
     "'aiter_lse_fp8_two_split' reads no param 'min_kv_split'"),  # named at the path's own line
    ("params: {pad_heads_to: 16, num_kv_splits: 1}", "params: {pad_heads_to: 16, num_kv_splits: one}",
     "param 'num_kv_splits' must be an int in [1, 2147483647] (got 'one')"),
    ("params: {pad_heads_to: 16}\n", "params: {pad_heads_to: 16, return_lse: false}\n",
     "path 'aiter_lse' reads no param 'return_lse'"),  # the aiter_lse paths always return the LSE
    ("params: {pad_heads_to: 16, pad_heads_multiple: 16, max_split_per_batch: 32,",
     "params: {pad_heads_multiple: 16, max_split_per_batch: 32,", "needs the params ['pad_heads_to']"),
    ("max_split_per_batch: 32, kv_granularity: 16, fast_mode: true}", "max_split_per_batch: 32}",
     "needs the params ['kv_granularity', 'fast_mode']"),  # AITER's metadata choices, the table's since session 43
    ("kv_granularity: 16, fast_mode: true}", "kv_granularity: 16, fast_mode: 1}",
     "param 'fast_mode' must be a bool"),
    # heads padded past what the path takes (a break test, fifty-third session: 24 heads were planned as 208)
    ("params: {return_lse: true, pad_heads_to: 64}", "params: {return_lse: true, pad_heads_to: 200}",
     "row 'gfx950_fp8_h32_persistent_lse_padded_64': param 'pad_heads_to' pads every call to 208 heads, which path "
     "'aiter_persistent' does not take: num_heads le 128 (AITER's MLA decode kernels exist for at most 128 query "
     "heads)"),
])
def test_row_params_are_checked_when_the_table_loads(tmp_path, old, new, text):
    """A row's params, merged with its path's, are the ones its path's planner reads, of their types: a table
    with a misspelt or mistyped param loaded and passed the checker (break test, thirty-second session)."""
    from mla_sink import dispatch
    from mla_sink.core.tables import table_path
    from mla_sink.paths.aiter.plan import check_mla_params

    source = open(table_path("mla_decode")).read()
    assert source.count(old) == 1
    path = tmp_path / "mla_decode.yaml"
    path.write_text(source.replace(old, new))
    with pytest.raises(dispatch.TableError, match=re.escape(text)):
        check_mla_params(dispatch.load_table(str(path)))
