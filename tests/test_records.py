"""CallSpec / Platform: construction-time validation, canonical keys, hashability."""

from __future__ import annotations

import attrs
import pytest

from mla_sink import CallSpec, Platform, call_key


def test_canonical_key_matches_design_example():
    s = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=64, topk=2048, sinks=True)
    assert call_key(s, Platform("gfx942", "0.1.20")) == "bf16-h64-gfx942-sinks-dcp1"
    assert str(s) == "bf16-h64-sinks-dcp1"
    assert str(Platform("gfx942", "0.1.20")) == "gfx942-aiter0.1.20-triton"
    assert str(Platform("cpu", triton=False)) == "cpu-noaiter-notriton"


def test_key_names_non_default_fields():
    s = CallSpec(q_dtype="bf16", kv_dtype="fp8_e4m3", num_heads=16, topk=64, dcp_world_size=2, need_lse=True, logit_cap=30)
    assert call_key(s, Platform("sm90")) == "bf16+kv_fp8_e4m3-h16-sm90-nosinks-dcp2-cap30"
    # one cap, one key: '%g' gave 30.000001 the key of 30 (thirty-ninth session's break test)
    for cap, text in ((30.000001, "cap30.000001"), (2 ** 31, "cap2147483648"), (0.5, "cap0.5"), (1e30, "cap1e+30")):
        assert str(attrs.evolve(s, logit_cap=cap)).endswith(text), cap


def test_kv_rows_packed_is_read_from_the_cache_and_named_in_the_key():
    """A ``[N, 576]`` view of wider rows is not packed (AITER takes packed rows only: tables/mla_decode.yaml); the
    key says so; a cache of one row is packed whatever its stride; a paged V3.2 pool with a gap between its pages is
    not; the spec's value is a bool."""
    import torch

    from mla_sink import describe

    q, idx = torch.zeros(2, 16, 576, dtype=torch.bfloat16), torch.zeros(2, 8, dtype=torch.int32)
    wide = torch.zeros(8, 640, dtype=torch.bfloat16)
    for kv, packed in ((wide[:, :576].contiguous(), True), (wide[:, :576], False), (wide[:1, :576], True)):
        s, _ = describe(q, kv, idx, platform=Platform("cpu"))
        assert s.kv_rows_packed is packed and str(s).endswith("-kvstrided") == (not packed)
    pages = torch.zeros(4, 65, 656, dtype=torch.uint8)
    for pool, packed in ((pages[:, :64].contiguous(), True), (pages[:, :64], False), (pages[:1, :64], True)):
        assert describe(q, pool, idx, platform=Platform("cpu"))[0].kv_rows_packed is packed
    assert call_key(CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=8, kv_rows_packed=False),
                    Platform("gfx942", "0.1.20")) == "bf16-h16-gfx942-nosinks-dcp1-kvstrided"
    with pytest.raises(ValueError, match="'kv_rows_packed' must be a bool"):
        CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=8, kv_rows_packed=1)


def test_kv_cache_bytes_is_read_from_the_cache():
    """``kv_cache_bytes`` is the bytes the pool spans, from its first byte to the end of its last row, whatever its
    layout: ``N * 1152`` for a contiguous bf16 ``[N, 576]``, less the last row's gap for a view of wider rows, the
    pages' gaps for a paged V3.2 pool, 0 for an empty pool, past 2^32 bytes for a pool that big. The record
    takes an int in ``[0, 2^63 - 1]``."""
    import torch

    from mla_sink import describe
    from mla_sink.core.kv_layout import span_bytes

    q, idx = torch.zeros(2, 16, 576, dtype=torch.bfloat16), torch.zeros(2, 8, dtype=torch.int32)
    wide = torch.zeros(8, 640, dtype=torch.bfloat16)
    pages = torch.zeros(4, 65, 656, dtype=torch.uint8)
    for kv, size in ((wide[:, :576].contiguous(), 8 * 1152), (wide[:, :576], (7 * 640 + 576) * 2),
                     (pages[:, :64], 3 * 65 * 656 + 64 * 656),
                     (pages[:, :64].contiguous(), 4 * 64 * 656), (pages[:2, :64], 65 * 656 + 64 * 656)):
        assert describe(q, kv, idx, platform=Platform("cpu"))[0].kv_cache_bytes == size, kv.shape
    assert span_bytes(wide[:0, :576]) == 0  # an empty pool (a DCP rank's shard may be one)
    rows = 2 ** 32 // 1152 + 1  # past 4 GiB, allocated lazily (torch.empty touches no page; describe reads none)
    s, _ = describe(q, torch.empty(rows, 576, dtype=torch.bfloat16), idx, platform=Platform("cpu"))
    assert s.kv_cache_bytes == rows * 1152 > 2 ** 32
    base = dict(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=8)
    assert CallSpec(**base, kv_cache_bytes=2 ** 63 - 1).kv_cache_bytes == 2 ** 63 - 1
    for bad in (-1, 2 ** 63, 1.0, True, "1"):
        with pytest.raises(ValueError, match=r"'kv_cache_bytes' must be an int in \[0, 2\^63 - 1\]"):
            CallSpec(**base, kv_cache_bytes=bad)


@pytest.mark.parametrize("value, on", [(None, False), ("0", False), ("1", True), ("2", True), (" 1", True),
                                       ("-1", True), ("yes", False), ("", False), ("true", False)])
def test_aiter_experimental_is_read_as_aiter_reads_it(monkeypatch, value, on):
    """``AITER_ENABLE_EXPERIMENTAL`` as ``aiter/jit/core.py`` reads it (``int(value) != 0``, anything else off);
    the platform's key names it; the CPU's platform never has it (no AITER)."""
    from mla_sink.core.platform import _aiter_experimental, detect_platform

    if value is None:
        monkeypatch.delenv("AITER_ENABLE_EXPERIMENTAL", raising=False)
    else:
        monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", value)
    assert _aiter_experimental() is on
    assert detect_platform("cpu").aiter_experimental is False
    assert str(Platform("gfx950", "0.1.20", aiter_experimental=True)) == "gfx950-aiter0.1.20-experimental-triton"
    with pytest.raises(ValueError, match="'aiter_experimental' must be a bool"):
        Platform("gfx950", "0.1.20", aiter_experimental=1)
    for arch in ("gfx950", "cpu", "sm90"):  # AITER's switch without AITER: a contradiction, refused
        with pytest.raises(ValueError, match="'aiter_experimental' describes AITER's kernels: it must be False"):
            Platform(arch, aiter_experimental=True)


def test_need_lse():
    base = dict(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=64)
    assert not CallSpec(**base).need_lse
    assert CallSpec(**base, sinks=True).need_lse
    assert CallSpec(**base, dcp_world_size=2).need_lse
    assert CallSpec(**base, need_lse=True).need_lse
    assert CallSpec(**base, sinks=True, need_lse=False).need_lse  # implied, corrected at construction
    assert str(CallSpec(**base, need_lse=True)) == "bf16-h16-nosinks-dcp1-lse"
    assert str(CallSpec(**base, sinks=True, need_lse=True)) == "bf16-h16-sinks-dcp1"


def test_records_are_frozen_and_hashable():
    s = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=64)
    assert hash(s) == hash(CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=64))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        s.num_heads = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(q_dtype="fp32"), "q_dtype"),
        (dict(kv_dtype="int8"), "kv_dtype"),
        (dict(num_heads=0), "num_heads"),
        (dict(num_heads=True), "num_heads"),
        (dict(topk=0), "topk"),
        (dict(dcp_world_size=0), "dcp_world_size"),
        (dict(sinks="yes"), "sinks"),
        (dict(logit_cap=float("nan")), "logit_cap"),
        (dict(q_dtype="fp8_e4m3", kv_dtype="bf16"), "q_dtype"),
        (dict(q_dtype="fp8_e4m3", kv_dtype="fp8_e4m3fnuz"), "kv_dtype"),
    ],
)
def test_callspec_rejects_bad_field(kwargs, field):
    base = dict(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=64)
    base.update(kwargs)
    with pytest.raises(ValueError, match=field) as info:
        CallSpec(**base)
    assert "got" in str(info.value)


@pytest.mark.parametrize("arch", ["sm90x", "sm_90z", "sm100b"])
def test_an_nvidia_suffix_that_names_no_target_is_refused(arch):
    """Only ``a`` and ``f`` are NVIDIA's feature suffixes; ``sm90x`` was read as sm90 (a break test, forty-third
    session)."""
    with pytest.raises(ValueError, match=f"'arch' must be a compile target .*got '{arch}'"):
        Platform(arch)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "gfx90a", "gfx1100", "sm80", "sm90", "sm100", "cpu"])
def test_platform_accepts_arch(arch):
    assert Platform(arch).arch == arch
    assert Platform(arch.upper()).arch == arch  # any case: 'CPU', 'SM90' (a break test, forty-third session)


@pytest.mark.parametrize("arch,plain", [("sm90a", "sm90"), ("sm100a", "sm100"), ("sm100f", "sm100"), ("sm120a", "sm120"),
                                        ("sm090", "sm90"), ("sm090a", "sm90"),
                                        # ROCm target ids, as gcnArchName reports them (fortieth session's break
                                        # test: --arch gfx942:sramecc+:xnack- was refused)
                                        ("gfx942:sramecc+:xnack-", "gfx942"), ("gfx950:xnack+", "gfx950"),
                                        ("gfx90a:sramecc-:xnack+", "gfx90a"),
                                        # nvcc's and torch's spelling, and any case (forty-third session's break
                                        # test: sm_90a, SM90 and CPU were refused)
                                        ("sm_90a", "sm90"), ("sm_90", "sm90"), ("SM90", "sm90"), ("Sm_100F", "sm100"),
                                        ("GFX942:sramecc+:xnack-", "gfx942"), ("GFX90A", "gfx90a")])
def test_nvidia_feature_suffixes_name_the_plain_target(arch, plain):
    """A break test's finding: ``--arch sm90a`` was accepted but planned as an unknown target (the portable kernel with
    the fallback tiles), while ``sm90`` gets the Gluon kernels. The suffix names the same GPUs: the record keeps the
    plain name, so both plan alike. AMD's ``gfx90a`` (its own GPU) keeps its letter (above)."""
    from mla_sink import plan_call

    assert Platform(arch).arch == plain and Platform(arch) == Platform(plain)
    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=128, topk=2048)
    assert plan_call(spec, Platform(arch, num_sms=132)) == plan_call(spec, Platform(plain, num_sms=132))


@pytest.mark.parametrize(
    "kwargs,text",
    [
        (dict(arch="9.0"), "'arch' must be a compile target"),
        (dict(arch=(9, 0)), "'arch' must be a compile target"),
        (dict(arch="cuda"), "'arch' must be a compile target"),
        # a one-digit compute capability is no target, with or without leading zeros (thirty-ninth session's break
        # test: 'sm09' and 'sm00' were accepted as cuda_arch 9 and 0 while 'sm9' was refused)
        (dict(arch="sm09"), r"'arch' must be a compile target .* \(got 'sm09'\)"),
        (dict(arch="sm00"), r"'arch' must be a compile target .* \(got 'sm00'\)"),
        (dict(arch="sm9"), r"'arch' must be a compile target .* \(got 'sm9'\)"),
        (dict(arch="gfx0942"), r"'arch' must be a compile target .* \(got 'gfx0942'\)"),  # no AMD name starts at 0
        (dict(arch="gfx942:"), r"'arch' must be a compile target .* \(got 'gfx942:'\)"),
        (dict(arch="gfx942:xnack"), r"'arch' must be a compile target .* \(got 'gfx942:xnack'\)"),
        (dict(arch="gfx942", aiter_version="latest"), "'aiter_version'"),
        (dict(arch="cpu", triton="yes"), "'triton'"),
        # the interpreter has no SMs: a count made the plan split as if it had them (it was the CLI's check)
        (dict(arch="cpu", num_sms=132), "'num_sms' counts a GPU's SMs / CUs; arch 'cpu'"),
    ],
)
def test_platform_rejects(kwargs, text):
    with pytest.raises(ValueError, match=text):
        Platform(**kwargs)


@pytest.mark.parametrize("arch", ["sm90", "cpu", "gfx90a"])
def test_aiter_on_an_arch_it_does_not_serve_is_the_table_s_reason(arch):
    """Which archs AITER serves is a row of tables/mla_decode.yaml (the AITER paths' ``requires``), not a check of
    the record: an ``aiter_version`` there is a platform the table routes away from AITER, saying why."""
    from mla_sink import explain_call, plan_call

    platform = Platform(arch, "0.1.20")
    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=64)
    assert not plan_call(spec, platform).path.startswith("aiter")
    assert "AITER ships MLA decode kernels for gfx942 (MI300) and gfx950 (MI350) only" in explain_call(spec, platform)


def test_detect_on_this_machine_reads_cpu_without_aiter():
    p = Platform.detect("cpu")
    assert p.arch == "cpu" and p.aiter_version is None


def test_describe_refuses_a_platform_that_is_not_a_record():
    """``describe(..., platform=...)`` takes a :class:`Platform` or None, as the function does (a second break test:
    ``platform="sm90"`` came back unchecked)."""
    import torch

    from mla_sink import describe

    q = torch.zeros(1, 4, 576, dtype=torch.bfloat16)
    kv = torch.zeros(8, 576, dtype=torch.bfloat16)
    idx = torch.zeros(1, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="'platform' must be a mla_sink.Platform or None"):
        describe(q, kv, idx, platform="sm90")
    assert describe(q, kv, idx, platform=Platform("sm90"))[1] == Platform("sm90")


@pytest.mark.parametrize("given", ["0.1.20", " 0.1.20 ", "v0.1.20", "V0.1.20"])
def test_one_aiter_version_is_one_platform(given):
    """A version is kept in its canonical PEP 440 form, so spellings of one version make one record, one key and
    one ``str`` (a second break test: ``' 0.1.20 '`` printed as ``gfx942-aiter 0.1.20 -triton``)."""
    p = Platform("gfx942", given)
    assert p == Platform("gfx942", "0.1.20") and str(p) == "gfx942-aiter0.1.20-triton"


@pytest.mark.parametrize("field", ["num_heads", "topk", "dcp_world_size"])
def test_counts_beyond_int32_are_refused(field):
    """The kernels take heads, topk and rank counts as int32: a record took 2^31 (and ``mla-sink explain`` refused the
    same value as a flag; a break test, thirty-first session). 2^31 - 1 is still a valid record, but for topk, whose
    bound is 2^30 (the test below)."""
    base = dict(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=64)
    CallSpec(**{**base, field: 2 ** 31 - 1 if field != "topk" else 2 ** 30})
    # topk names its own bound, 2^30, at 2^31 too (it named 2^31 - 1 there, which it then refused: a break test,
    # sixtieth session)
    bound = r"1073741824 \(2\^30" if field == "topk" else r"2147483647: the kernels take it as an int32"
    with pytest.raises(ValueError, match=rf"'{field}' must be an int <= {bound}"):
        CallSpec(**{**base, field: 2 ** 31})
    with pytest.raises(ValueError, match=r"'num_sms' must be None or an int in \[1, 2147483647\]"):
        Platform("sm90", None, num_sms=2 ** 31)


def test_plans_layers_and_refusals_pickle_and_deep_copy():
    """A plan's params, a selection's fields and a row's params were ``MappingProxyType`` s, which neither pickle
    nor deep-copy: ``copy.deepcopy`` of a model holding the layer failed, and a ``NoKernelError`` raised in a worker
    process reached the parent as a pickling ``TypeError`` (break test, thirty-second session). They are read-only
    dicts now; the error pickles with its text and selection."""
    import copy
    import pickle

    import torch

    from mla_sink import NoKernelError, SparseMLADecode, plan_call

    plan = plan_call(CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=64), Platform("cpu"))
    for clone in (pickle.loads(pickle.dumps(plan)), copy.deepcopy(plan)):
        assert clone == plan and dict(clone.params) == dict(plan.params)
    with pytest.raises(TypeError, match="read-only"):
        plan.params["num_kv_splits"] = 2
    layer = SparseMLADecode(num_heads=4, q_dtype="bf16", kv_dtype="bf16", topk=8, sinks=torch.zeros(4))
    q, kv = torch.randn(2, 4, 576).bfloat16(), torch.randn(64, 576).bfloat16()
    idx = torch.randint(0, 64, (2, 8), dtype=torch.int32)
    assert torch.equal(copy.deepcopy(layer)(q, kv, idx)[0], layer(q, kv, idx)[0])
    with pytest.raises(NoKernelError, match="fp8 KV needs sm89") as info:
        plan_call(CallSpec(q_dtype="bf16", kv_dtype="fp8_e4m3", num_heads=4, topk=8), Platform("sm80"))
    info.value.add_note("raised in a worker")
    for clone in (pickle.loads(pickle.dumps(info.value)), copy.copy(info.value)):
        assert str(clone) == str(info.value) and "refused" in clone.explanation
        assert clone.__notes__ == ["raised in a worker"]
        assert clone.selection.row.id == info.value.selection.row.id


def test_equal_versions_are_one_record_and_gluon_needs_triton():
    """'0.1.20.0' and '0.1.20' are one PEP 440 version, so one record and one key (they made two); Gluon is Triton's
    dialect, so ``triton=False`` makes ``gluon`` False (``gluon=True`` was kept; a break test), also through
    ``attrs.evolve``."""
    assert Platform("gfx942", "0.1.20.0") == Platform("gfx942", "0.1.20") == Platform("gfx942", "v0.1.20")
    assert Platform("gfx942", "0.1.20.0.post1").aiter_version == "0.1.20.post1"
    assert Platform("gfx942", "0.1.0").aiter_version == "0.1.0"  # three release numbers stay
    assert Platform("gfx942", "0.1") == Platform("gfx942", "0.1.0")  # and missing ones are added
    assert Platform("cpu", triton=False).gluon is False
    assert Platform("cpu", triton=False, gluon=True).gluon is False
    import attrs

    assert attrs.evolve(Platform("sm90"), triton=False).gluon is False


def test_an_arch_with_a_trailing_newline_is_refused():
    # a second break test's finding: the pattern's "$" matched before a trailing newline, so "sm90\n" became sm90
    # once the suffix was folded, while "cpu\n" was kept with its newline
    for arch in ("sm90\n", "cpu\n", "gfx942\n"):
        with pytest.raises(ValueError, match="'arch' must be a compile target"):
            Platform(arch)


def test_explain_arch_with_a_feature_suffix_is_this_machines_target(monkeypatch):
    """A second break test's finding: ``explain --arch sm90a`` on an sm90 machine compared the text with the
    detected arch before the suffix was folded, so it lost the machine's SM count and Gluon flag (and on AMD the
    AITER version) that ``--arch sm90`` keeps."""
    import argparse

    from mla_sink.core import platform as platform_mod
    from mla_sink.tools import cli

    here = Platform("sm90", num_sms=132, gluon=False)
    monkeypatch.setattr(platform_mod, "detect_platform", lambda *a, **k: here)
    args = dict(aiter=None, triton=None, sms=None)
    plain = cli._platform_from_args(argparse.Namespace(arch="sm90", **args))
    assert plain == here
    assert cli._platform_from_args(argparse.Namespace(arch="sm90a", **args)) == plain


def test_topk_beyond_2_30_is_refused_by_the_records_and_the_call():
    """The kernels step int32 id positions past the last id: topk 2^31 - 1 planned in 32 splits lost the last split
    (its end wrapped negative) and in one split read out of bounds on the H200 (thirty-ninth session's break test).
    topk is at most 2^30, refused beyond it by the records (the layer, the CLI) and by the call's validation."""
    import torch

    import mla_sink
    from mla_sink.core.records import TOPK_MAX

    assert TOPK_MAX == 2 ** 30
    CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=TOPK_MAX)
    for topk in (TOPK_MAX + 1, 2 ** 31 - 1):
        with pytest.raises(ValueError, match=r"'topk' must be an int <= 1073741824"):
            CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=topk)
    q = torch.empty(1, 16, 576, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(64, 576, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match=r"'indices' must be \[T, topk\] with topk <= 1073741824"):
        mla_sink.sparse_mla_decode(q, kv, torch.empty(1, TOPK_MAX + 1, dtype=torch.int32, device="meta"))
    out, _ = mla_sink.sparse_mla_decode(q, kv, torch.empty(1, TOPK_MAX, dtype=torch.int32, device="meta"))
    assert out.shape == (1, 16, 512)



def test_the_stride_facts_are_read_from_the_tensors_and_named_in_the_key():
    """``gather_aligned`` and ``unit_rows`` (the strides the Gluon kernels gather with) are bool fields, default True,
    read by describe from the tensors' strides (contiguous tensors have both) and named in the key when False."""
    import torch

    from mla_sink import describe

    q = torch.zeros(2, 4, 576, dtype=torch.bfloat16)
    kv = torch.zeros(8, 576, dtype=torch.bfloat16)
    idx = torch.zeros(2, 37, dtype=torch.int32)  # contiguous at a topk the seesaw does not take: still aligned
    cases = [((q, kv, idx), True, True),
             ((torch.zeros(2, 4, 580, dtype=torch.bfloat16)[..., :576], kv, idx), False, True),
             ((q, torch.zeros(8, 580, dtype=torch.bfloat16)[:, :576], idx), False, True),
             ((q, torch.zeros(8, 640, dtype=torch.bfloat16)[:, :576], idx), True, True),
             ((q, kv, torch.zeros(2, 1028, dtype=torch.int32)[:, :1024]), False, True),
             ((q, kv, torch.zeros(2, 1040, dtype=torch.int32)[:, :1024]), True, True),
             ((q, kv, torch.zeros(2, 64, dtype=torch.int32)[:, ::2]), True, False)]
    for (q_, kv_, idx_), aligned, unit in cases:
        s, _ = describe(q_, kv_, idx_, platform=Platform("cpu"))
        assert (s.gather_aligned, s.unit_rows) == (aligned, unit), (q_.stride(), kv_.stride(), idx_.stride())
        assert ("-unaligned" in str(s)) == (not aligned) and ("-rowstrided" in str(s)) == (not unit)
    for field in ("gather_aligned", "unit_rows"):
        with pytest.raises(ValueError, match=f"'{field}' must be a bool"):
            CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=8, **{field: 1})


@pytest.mark.parametrize("arch", ["sm90", "gfx942", "cpu"])
def test_a_forced_reference_is_the_same_answer_from_every_entry_point(arch, capsys):
    """``path='reference'`` is always honoured: plan_call runs it, and explain_call says so as ``mla-sink explain
    --path reference`` does (explain_call said "no row matched" while the call ran the reference: a break test,
    forty-third session); select names it too (it answered "no row matched", forty-sixth session)."""
    from mla_sink import explain_call, plan_call, select
    from mla_sink.core.select import FORCED_REFERENCE
    from mla_sink.tools.cli import main

    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=2048)
    platform = Platform(arch, "0.1.20" if arch.startswith("gfx") else None, num_sms=1 if arch == "cpu" else 132)
    assert plan_call(spec, platform, path="reference").path == "reference"
    sel = select(spec, platform, path="reference")
    assert (sel.path, sel.refused, sel.row, dict(sel.params)) == ("reference", False, None, {})
    assert dict(sel.values) == dict(select(spec, platform).values)  # the table's own fields, as any selection
    text = explain_call(spec, platform, path="reference")
    assert text.splitlines() == [call_key(spec, platform), FORCED_REFERENCE]
    argv = ["explain", "--arch", arch, "--heads", "16", "--path", "reference"]
    argv += ["--aiter", "0.1.20"] if arch.startswith("gfx") else ["--sms", "1" if arch == "cpu" else "132"]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == text.splitlines()


@pytest.mark.parametrize("field", ["num_heads", "topk", "dcp_world_size", "logit_cap", "num_sms"])
def test_a_huge_int_field_is_named_briefly(field):
    """``10**400`` put all 401 digits in the record's message (a break test, forty-third session)."""
    with pytest.raises(ValueError, match=r"got 100000\.\.\. \(an int of 401 digits\)\)") as e:
        if field == "num_sms":
            Platform("sm90", num_sms=10 ** 400)
        else:
            CallSpec(**{"q_dtype": "bf16", "kv_dtype": "bf16", "num_heads": 16, "topk": 64, field: 10 ** 400})
    assert len(str(e.value)) < 200


def test_dtype_keys_and_the_cap_take_what_the_call_takes():
    """A break test (sixtieth session): a one-element numpy array as ``q_dtype`` passed the field's check and failed
    later as ``TypeError: unhashable``; ``numpy.str_`` was kept as such (its repr in the record's); a tensor
    ``logit_cap`` was taken by ``float()`` (a device sync on a GPU) where the function and the layer refuse it."""
    import numpy as np
    import torch

    from mla_sink import describe

    base = dict(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=64)
    with pytest.raises(ValueError, match=r"^'q_dtype' must be in \('bf16', .*\(got array\(\['bf16'\]"):
        CallSpec(**{**base, "q_dtype": np.array(["bf16"])})
    s = CallSpec(**{**base, "q_dtype": np.str_("bf16"), "kv_dtype": np.str_("fp8_ds_mla")})
    assert type(s.q_dtype) is str and type(s.kv_dtype) is str and s == CallSpec(**{**base, "kv_dtype": "fp8_ds_mla"})
    assert "np.str_" not in repr(s)
    for cap in (torch.tensor(5.0), np.array(5.0)):
        with pytest.raises(ValueError, match=r"^'logit_cap' must be a finite float, a Python or numpy real"):
            CallSpec(**base, logit_cap=cap)
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    kv = torch.zeros(64, 576, dtype=torch.bfloat16)
    idx = torch.zeros(2, 64, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^'logit_cap' must be a finite float"):
        describe(q, kv, idx, logit_cap=torch.tensor(5.0))
    assert CallSpec(**base, logit_cap=np.float32(5.0)).logit_cap == 5.0 == CallSpec(**base, logit_cap=5).logit_cap
