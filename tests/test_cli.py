"""The ``mla-sink`` command line: explain (text, --json, --matrix, refusals), info, demo."""

from __future__ import annotations

import json
import re

import pytest

from mla_sink.tools.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_explain_takes_the_pool_size_and_aiter_experimental(capsys):
    """``--kv-cache-bytes`` past 2^32 and ``--aiter-experimental`` (fp8 persistent) keep a call off AITER, with the
    table's reason; within the bounds (and by default) the same call is AITER's."""
    base = ("explain", "--arch", "gfx950", "--aiter", "0.1.20", "--sinks", "--json")
    for extra, path, reason in (
            ((), "aiter_lse", None),
            (("--kv-cache-bytes", str(2 ** 32)), "aiter_lse", None),
            (("--kv-cache-bytes", str(2 ** 32 + 1)), "triton", "kv_cache_bytes=4294967297, needs <= 4294967296"),
            (("--q-dtype", "fp8_e4m3", "--heads", "64"), "aiter_persistent", None),
            (("--q-dtype", "fp8_e4m3", "--heads", "64", "--aiter-experimental"), "triton",
             "aiter_experimental=true, needs false"),
            (("--q-dtype", "fp8_e4m3", "--heads", "64", "--no-aiter-experimental"), "aiter_persistent", None)):
        code, out = run_cli(capsys, *base, *extra)
        doc = json.loads(out)
        assert code == 0 and doc["path"] == path, (extra, doc["path"])
        assert doc["platform"]["aiter_experimental"] is ("--aiter-experimental" in extra)
        _, text = run_cli(capsys, *base[:-1], *extra)
        assert reason is None or reason in text, text


def test_explain_names_key_path_row_and_rejections(capsys):
    code, out = run_cli(capsys, "explain", "--arch", "gfx942", "--aiter", "0.1.20", "--q-dtype", "bf16",
                        "--heads", "64", "--sinks")
    assert code == 0
    assert out.splitlines()[0] == "bf16-h64-gfx942-sinks-dcp1"
    assert "→ triton   (row triton_portable)" in out
    line = next(x for x in out.splitlines() if x.startswith("  ✗ aiter_lse_bf16_gfx942: "))
    assert "num_heads=64, needs one of [32, 128]" in line and "64-head bucket" in line
    assert "AITER not importable" not in out  # AITER is there: its path requirements hold, no path-level line
    assert not any(x.startswith("  ✗ path") for x in out.splitlines())


def test_explain_states_each_mismatch_once(capsys):
    """Without AITER, the thirteen AITER rows are one line naming their four paths; nothing is said twice."""
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--heads", "128")
    assert code == 0
    rejected = [x for x in out.splitlines() if x.startswith("  ✗")]  # the rule table's (the launch's are indented)
    assert len(rejected) == 3, out
    paths_line, refusal_line, ds_mla_line = rejected
    assert ds_mla_line == "  ✗ fp8_ds_mla_amd_triton: arch=sm90, needs one of [gfx942, gfx950]; kv_dtype=bf16, needs fp8_ds_mla"
    assert paths_line.startswith("  ✗ paths aiter_persistent (rows aiter_persistent_bf16, ")
    for name in ("aiter_lse (rows", "aiter_lse_single_split (row gfx950_bf16_h32_lse_single_split)",
                 "aiter_lse_fp8_two_split (rows"):
        assert name in paths_line
    assert "arch=sm90, needs one of [gfx942, gfx950]" in paths_line
    assert "aiter_version=None, needs a value (AITER not importable) and >= 0.1.19 (" in paths_line
    assert refusal_line.startswith("  ✗ fp8_needs_sm89: ")
    said = [part for x in rejected for part in x.split(": ", 1)[1].split("; ")]
    assert len(said) == len(set(said)), said
    assert out.count("AITER not importable") == 1 and out.count("aiter_version=None") == 1


@pytest.mark.parametrize("arch,reason", [
    ("gfx950", "gfx950's mla_decode_fwd_ds32 (AITER 0.1.20) takes the cache as three dense buffers"),
    ("gfx942", "gfx942 has no ds32 entry point; its one byte-KV kernel"),
])
def test_explain_fp8_ds_mla_on_amd_goes_to_triton_with_the_reason(capsys, arch, reason):
    """The 656-byte V3.2 rows on AMD: the row that sends them to Triton says why no AITER kernel takes them
    (docs/DESIGN.md "AITER and the 656-byte V3.2 FP8 layout"), and the AITER paths say they read 576-column rows."""
    code, out = run_cli(capsys, "explain", "--arch", arch, "--aiter", "0.1.20", "--q-dtype", "bf16",
                        "--kv-dtype", "fp8_ds_mla", "--heads", "128", "--sinks")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"bf16+kv_fp8_ds_mla-h128-{arch}-sinks-dcp1"
    assert lines[1] == "  → triton   (row fp8_ds_mla_amd_triton)"
    assert lines[2].startswith("    why: No AITER kernel reads the 656-byte rows as they are.") and reason in lines[2]
    assert "E8M0" in lines[2] and "writes no LSE" in lines[2]
    assert lines[3].startswith("    source: ROCm/aiter@") and "csrc/kernels/mla/ds32_decode_fwd.cu" in lines[3]
    paths_line = next(x for x in lines if x.startswith("  ✗ paths aiter_persistent (rows "))
    assert "kv_dtype=fp8_ds_mla, needs not fp8_ds_mla" in paths_line


def test_explain_dcp_shows_persistent_rejected_for_lse(capsys):
    code, out = run_cli(capsys, "explain", "--arch", "gfx950", "--aiter", "0.1.20", "--heads", "64", "--dcp", "2")
    assert code == 0
    line = next(x for x in out.splitlines() if "✗ aiter_persistent_bf16" in x)
    assert "need_lse=true" in line and "writes no LSE" in line


def test_explain_json(capsys):
    code, out = run_cli(capsys, "explain", "--arch", "gfx950", "--aiter", "0.1.20", "--heads", "32", "--sinks", "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc["path"] == "aiter_lse_single_split" and doc["params"] == {"num_kv_splits": 1, "pad_heads_to": 16}
    assert doc["row"]["params"] == {}  # the params are the path's defaults (tables/mla_decode.yaml)
    assert doc["key"] == "bf16-h32-gfx950-sinks-dcp1"
    assert any(r["row"] == "aiter_persistent_bf16" for r in doc["rejected"])
    assert doc["rejected_paths"] == []


def test_explain_json_groups_rejections_by_path(capsys):
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--heads", "128", "--json")
    doc = json.loads(out)
    assert code == 0
    groups = {g["path"]: g for g in doc["rejected_paths"]}
    assert set(groups) == {"aiter_persistent", "aiter_lse", "aiter_lse_single_split", "aiter_lse_fp8_two_split"}
    assert groups["aiter_lse_single_split"]["rows"] == ["gfx950_bf16_h32_lse_single_split"]
    assert [(f["field"], f["op"]) for f in groups["aiter_lse"]["failures"]] == [
        ("arch", "in"), ("aiter_version", "present"), ("aiter_version", "at_least")]
    assert [r["row"] for r in doc["rejected"]] == ["fp8_needs_sm89", "fp8_ds_mla_amd_triton"]


def test_explain_refusal_exits_2(capsys):
    code, out = run_cli(capsys, "explain", "--arch", "sm80", "--aiter", "none", "--q-dtype", "bf16",
                        "--kv-dtype", "fp8_e4m3")
    assert code == 2
    assert "refused" in out and "sm89" in out


def test_explain_bad_flag_value_exits_2(capsys):
    code = main(["explain", "--arch", "mi300"])
    err = capsys.readouterr().err
    assert code == 2 and "'arch' must be a compile target" in err


def test_matrix_shows_every_path(capsys):
    code, out = run_cli(capsys, "explain", "--matrix")
    assert code == 0
    body = "\n".join(out.splitlines()[3:-2])
    cells = set(body.split())
    for abbrev in ("P", "L", "L1", "L2", "T", "R", "✗"):
        assert abbrev in cells, abbrev


def test_matrix_shows_aiter_experimental_on(capsys):
    """A platform with AITER's experimental kernels on is a row of the matrix (``-experimental`` in its key), and
    there fp8 calls leave AITER where they take it with the switch off (tables/mla_decode.yaml, the HipKittens rows)."""
    from mla_sink.tools.cli import matrix_dict

    doc = matrix_dict()
    on = [k for k in doc if "-experimental" in k]
    assert len(on) == 1
    off = on[0].replace("-experimental", "")
    assert off in doc
    fp8_on, fp8_off = doc[on[0]]["fp8_e4m3fnuz/fp8_e4m3fnuz"], doc[off]["fp8_e4m3fnuz/fp8_e4m3fnuz"]
    left = [h for h, path in fp8_off.items() if path == "aiter_persistent" and fp8_on[h] == "triton"]
    assert "h128" in left and "h16" in left, (fp8_off, fp8_on)
    assert doc[on[0]]["bf16/bf16"] == doc[off]["bf16/bf16"]  # the switch concerns fp8 calls only
    code, out = run_cli(capsys, "explain", "--matrix")
    assert code == 0 and on[0] in out


def test_matrix_cells_sit_under_their_headers(capsys):
    """Every row of the matrix is as long as its header, the longest dtype label included
    (fp8_e4m3fnuz/fp8_e4m3fnuz), so each cell ends in its header's column."""
    code, out = run_cli(capsys, "explain", "--matrix")
    lines = out.splitlines()
    header, rows = lines[1], [ln for ln in lines[3:] if ln and not ln.startswith("legend")]
    assert code == 0 and rows and any("fp8_e4m3fnuz/fp8_e4m3fnuz" in r for r in rows)
    assert all(len(r) == len(header) for r in rows), [r for r in rows if len(r) != len(header)][:2]


def test_info_lists_paths(capsys):
    code, out = run_cli(capsys, "info")
    assert code == 0
    assert "✗ aiter_lse" in out and "AITER not importable" in out
    assert "reference" in out


@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_demo_runs_on_cpu(capsys, device):
    from mla_sink.core.platform import detect_platform

    code, out = run_cli(capsys, "demo", "--device", device, "--tokens", "2", "--topk", "64", "--pool", "256")
    assert code == 0
    # the path this machine's CPU takes (Triton's interpreter where it runs the kernel), not either of the two
    assert f"  → {'triton' if detect_platform('cpu').triton else 'reference'}   (row " in out
    assert "NaN in out: False" in out


def test_demo_q_dtype_follows_an_fp16_kv_dtype(capsys):
    code, out = run_cli(capsys, "demo", "--device", "cpu", "--tokens", "2", "--topk", "64", "--pool", "256",
                        "--kv-dtype", "fp16")
    assert code == 0 and "fp16" in out.splitlines()[0] and "NaN in out: False" in out


@pytest.mark.parametrize("argv", [["--help"], ["explain", "--help"], ["demo", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0


@pytest.mark.parametrize("argv,text", [
    (["demo", "--tokens", "0"], "'--tokens' must be in [1, 2147483647] (got 0)"),
    (["demo", "--pool", "0"], "'--pool-rows' must be in [1, 2147483647] (got 0)"),
    (["demo", "--pool-rows", "0"], "'--pool-rows' must be in [1, 2147483647] (got 0)"),  # the flag's first spelling
    (["demo", "--device", "meta"], "'--device' must be cpu or cuda"),
    (["explain", "--path", "garbage"], "--path: 'path' must be one of"),  # the flag named before the field
    # the CLI's "no forced path" is leaving the flag out, not None (a break test, forty-second session)
    (["explain", "--path", "garbage"], "or no --path to let the table choose (got 'garbage')"),
    (["demo", "--path", "garbage"], "or no --path to let the table choose (got 'garbage')"),
    (["explain", "--arch", "foo"], "--arch: 'arch' must be a compile target"),
    # --matrix covers every arch, dtype and head count: a call flag with it is refused, not ignored (second break test)
    (["explain", "--matrix", "--arch", "sm90"], "'--arch' does not apply to --matrix"),
    (["explain", "--matrix", "--no-triton"], "'--triton/--no-triton' does not apply to --matrix"),
    (["explain", "--matrix", "--no-kv-rows-packed"], "'--kv-rows-packed/--no-kv-rows-packed' does not apply to --matrix"),
    (["explain", "--matrix", "--heads", "64"], "'--heads' does not apply to --matrix"),
    # also at its default value (a fresh user's break test, twenty-sixth session: --heads 16 passed), and abbreviated
    (["explain", "--matrix", "--heads", "16"], "'--heads' does not apply to --matrix"),
    (["explain", "--matrix", "--tok", "64"], "'--tokens' does not apply to --matrix"),
    (["explain", "--logit-cap", "nan"], "--logit-cap: 'logit_cap' must be a finite float"),
    (["demo", "--path", "bogus"], "--path: 'path' must be one of"),
    (["explain", "--tokens", "-1"], "'--tokens' must be in [0, 2147483647] (got -1)"),  # 0 is a call (below)
    (["explain", "--heads", "0"], "'--heads' must be in [1, 2147483647] (got 0)"),
    (["explain", "--topk", "-3"], "'--topk' must be in [1, 1073741824] (got -3)"),  # topk's bound: 2^30
    (["explain", "--dcp", "0"], "'--dcp' must be in [1, 2147483647] (got 0)"),
    (["explain", "--kv-cache-bytes", "-1"], "'--kv-cache-bytes' must be in [0, 9223372036854775807] (got -1)"),
    (["explain", "--kv-cache-bytes", str(2 ** 63)], "'--kv-cache-bytes' must be in [0, 9223372036854775807]"),
    (["explain", "--arch", "sm90", "--sms", "-1"], "'--sms' must be in [1, 2147483647] (got -1)"),
    # counts past int32 (the kernels' argument type) were accepted and explained
    (["explain", "--heads", str(10 ** 20)], f"'--heads' must be in [1, 2147483647] (got {10 ** 20})"),
    (["explain", "--topk", str(2 ** 31)], f"'--topk' must be in [1, 1073741824] (got {2 ** 31})"),
    (["explain", "--topk", str(2 ** 30 + 1)], f"'--topk' must be in [1, 1073741824] (got {2 ** 30 + 1})"),
    (["demo", "--topk", "0"], "'--topk' must be in [1, 1073741824] (got 0)"),
    (["explain", "--tokens", str(10 ** 20)], "'--tokens' must be in [0, 2147483647]"),
    (["explain", "--arch", "sm90", "--sms", str(2 ** 40)], "'--sms' must be in [1, 2147483647]"),
    # the CPU's interpreter has no SMs: a count made the plan split as if it had them
    (["explain", "--arch", "cpu", "--sms", "132"], "--sms: 'num_sms' counts a GPU's SMs / CUs; arch 'cpu'"),
    (["explain", "--arch", ""], "'--arch' must not be empty"),  # was this machine's, silently
    (["explain", "--arch", "sm90", "--aiter", " "], "'--aiter' must not be empty"),  # was 'none', silently
    (["demo", "--device", "tpu"], "'--device' must be cpu or cuda"),
    # sizes past int32, or beyond the machine's memory, gave an allocator's traceback
    (["demo", "--pool", str(10 ** 12)], f"'--pool-rows' must be in [1, 2147483647] (got {10 ** 12})"),
    (["demo", "--topk", str(10 ** 10)], "'--topk' must be in [1, 1073741824]"),
    (["demo", "--tokens", "2147483647", "--heads", "2147483647"], "GiB of demo tensors, more than cpu"),
    (["demo", "--pool", "2000000000"], "'--pool-rows' 2000000000 need about"),
    (["demo", "--seed", str(10 ** 20)], "'--seed' must be in [0, 2**64 - 1]"),  # was an unnamed overflow
    (["demo", "--device", ""], "'--device' must not be empty"),  # was the default device, silently
])
def test_bad_flags_give_one_line_and_exit_2(argv, text, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and text in err and "Traceback" not in err


def test_demo_refuses_an_unknown_path_before_it_prints_anything(capsys):
    code = main(["demo", "--path", "bogus", "--tokens", "1", "--topk", "8", "--pool", "16"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "--path: 'path' must be one of" in err and "(got 'bogus')" in err


def test_forced_refused_path_exits_2_with_explanation(capsys):
    code = main(["demo", "--path", "aiter_lse", "--tokens", "1", "--topk", "8", "--pool", "16"])
    out = capsys.readouterr().out
    assert code == 2 and "not the requested path aiter_lse" in out


def test_explain_forced_reference(capsys):
    code, out = run_cli(capsys, "explain", "--path", "reference")
    assert code == 0 and "→ reference" in out
    code, out = run_cli(capsys, "explain", "--path", "reference", "--json")
    doc, other = json.loads(out), json.loads(run_cli(capsys, "explain", "--json")[1])
    # the same document as any other path's (it gave only key, path, row and refused: a break test)
    assert code == 0 and set(doc) == set(other)  # every document has one shape (a break test, forty-third session)
    assert (doc["path"], doc["row"]["id"], doc["launch"]) == ("reference", "forced", None)
    assert doc["key"] == other["key"] and set(doc["row"]) == set(other["row"]) and doc["values"] == other["values"]
    assert (doc["rejected"], doc["rejected_paths"], doc["reason"]) == ([], [], other["reason"])
    code, out = run_cli(capsys, "explain", "--arch", "sm80", "--q-dtype", "fp8_e4m3", "--kv-dtype", "fp8_e4m3",
                        "--json")
    refused = json.loads(out)
    assert code == 2 and set(refused) == set(other) and refused["launch"] is None and refused["refused"]


def test_matrix_json(capsys):
    code, out = run_cli(capsys, "explain", "--matrix", "--json")
    doc = json.loads(out)
    assert doc["gfx950-aiter0.1.20-triton"]["bf16/bf16"]["h32+s"] == "aiter_lse_single_split"
    assert doc["cpu-noaiter-notriton"]["bf16/bf16"]["h16"] == "reference"


@pytest.mark.parametrize("tokens,splits,kernel", [("256", 1, "gluon_seesaw"), ("2", 16, "gluon_seesaw")])
def test_explain_triton_launch(tokens, splits, kernel, capsys):
    """On the triton path, explain names the tuning row, the split count and the kernel variant."""
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--heads", "128", "--sinks", "--tokens", tokens,
                        "--sms", "132")
    assert code == 0
    assert f"triton launch at T={tokens} (on 132 SM(s)): kernel {kernel}" in out
    assert f"{splits} KV split(s) of" in out and "row sm90_default (tables/triton_tuning.yaml)" in out
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--heads", "128", "--tokens", tokens, "--sms", "132",
                        "--json")
    launch = json.loads(out)["launch"]
    assert (launch["tuning_row"], launch["num_kv_splits"], launch["kernel"]) == ("sm90_default", splits, kernel)


@pytest.mark.parametrize("argv,row,kernel_file", [
    (["--heads", "128", "--tokens", "256"], "sm90_default", "kernel gluon_seesaw (mla_sink/kernels/gluon/gluon_seesaw.py)"),
    (["--heads", "16", "--kv-dtype", "fp8_e4m3", "--tokens", "256"], "sm90_fp8_h16",
     "kernel gluon_fp8 (mla_sink/kernels/gluon/gluon_fp8.py)"),
    (["--heads", "16", "--kv-dtype", "fp8_e4m3", "--tokens", "2"], "sm90_fp8_h16_two_tokens",
     "kernel gluon_fp8 (mla_sink/kernels/gluon/gluon_fp8.py)"),
    (["--heads", "16", "--tokens", "2"], "sm90_h16", "kernel gluon_seesaw (mla_sink/kernels/gluon/gluon_seesaw.py)"),
    (["--heads", "16", "--tokens", "9"], "sm90_h16", "kernel portable (mla_sink/kernels/triton/portable.py)"),
    (["--heads", "16", "--kv-dtype", "fp8_e4m3fnuz", "--tokens", "2"], "sm90_fp8_h16",
     "kernel portable (mla_sink/kernels/triton/portable.py)"),
])
def test_explain_names_the_kernel_file(argv, row, kernel_file, capsys):
    code, out = run_cli(capsys, "explain", "--arch", "sm90", *argv, "--sms", "132")
    assert code == 0 and f"row {row} (tables/triton_tuning.yaml)" in out and kernel_file in out


@pytest.mark.parametrize("argv,row", [
    (["--kv-dtype", "fp8_e4m3", "--heads", "32", "--tokens", "64"], "e4m3_h32_split"),  # two splits
    (["--kv-dtype", "fp8_e4m3", "--heads", "32", "--tokens", "256"], "e4m3_h32_unsplit"),
    (["--kv-dtype", "fp8_ds_mla", "--heads", "16", "--tokens", "256"], "ds_mla_h16"),
    (["--kv-dtype", "fp8_ds_mla", "--heads", "24", "--tokens", "64"], "ds_mla_h32_split"),  # two splits
    (["--kv-dtype", "fp8_ds_mla", "--heads", "24", "--tokens", "256"], "ds_mla_h32"),
    (["--kv-dtype", "fp8_ds_mla", "--heads", "24", "--tokens", "2"], "ds_mla_h32_short"),  # one block a CTA
    (["--kv-dtype", "fp8_e4m3", "--heads", "16", "--tokens", "4"], "e4m3_h16_short"),  # two blocks a CTA
])
def test_explain_names_the_gluon_fp8_arrangement_row(argv, row, capsys):
    """A gluon_fp8 launch names its row of tables/gluon_fp8.yaml and why; no other launch prints one."""
    from mla_sink.kernels.gluon import tuning

    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--q-dtype", "bf16", *argv, "--sms", "132")
    why = tuning.gluon_fp8_table().row(row).why
    assert code == 0 and "kernel gluon_fp8" in out
    assert [line.strip().startswith(f"arrangement: row {row} (tables/gluon_fp8.yaml): ") and line.endswith(why)
            for line in out.splitlines() if "arrangement:" in line] == [True]
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--q-dtype", "bf16", *argv, "--sms", "132", "--json")
    assert json.loads(out)["launch"]["gluon_fp8_arrangement"]["row"] == row
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--heads", "128", "--tokens", "256", "--sms", "132")
    assert code == 0 and "arrangement:" not in out


@pytest.mark.parametrize("heads,tokens,block,ctas,defer", [(24, 2, 16, 2, False), (32, 4, 16, 2, False),
                                                           (32, 64, 32, 1, True), (16, 2, 16, 1, False),
                                                           (5, 256, 16, 1, True)])
def test_explain_json_gives_the_gluon_fp8_head_block_and_ctas_a_token(heads, tokens, block, ctas, defer, capsys):
    """Head groups in structured fields: one- and two-block CTAs at 17-32 heads run two 16-head CTAs a token."""
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--q-dtype", "bf16", "--kv-dtype", "fp8_e4m3", "--heads",
                        str(heads), "--tokens", str(tokens), "--sms", "132", "--json")
    arr = json.loads(out)["launch"]["gluon_fp8_arrangement"]
    assert code == 0 and (arr["head_block"], arr["ctas_per_token"], arr["deferred_row_sum"]) == (block, ctas, defer)
    assert ("CTAs a token" in arr["summary"]) == (ctas > 1)


@pytest.mark.parametrize("kv,heads,tokens,early", [("fp8_ds_mla", 32, 2, True), ("fp8_ds_mla", 16, 4, True),
                                                    ("fp8_ds_mla", 32, 256, False), ("fp8_e4m3", 32, 2, False)])
def test_explain_json_says_whether_the_first_ids_are_loaded_before_q(kv, heads, tokens, early, capsys):
    """V3.2's short CTAs load their first ids before q (``early_ids``): a structured field and the summary say so."""
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--q-dtype", "bf16", "--kv-dtype", kv, "--heads",
                        str(heads), "--tokens", str(tokens), "--sms", "132", "--json")
    arr = json.loads(out)["launch"]["gluon_fp8_arrangement"]
    assert code == 0 and arr["early_ids"] is early
    assert ("the first ids loaded before q" in arr["summary"]) == early


@pytest.mark.parametrize("kv", ["fp8_ds_mla", "fp8_e4m3"])
@pytest.mark.parametrize("heads,tokens", [(16, 2), (32, 2), (16, 64), (32, 64), (16, 256), (32, 256), (5, 4)])
def test_explain_json_gives_every_clause_of_the_arrangement_summary_as_a_field(kv, heads, tokens, capsys):
    """Each clause of the arrangement's summary is a structured field too (a break test, forty-eighth session: the
    summary said "the first consumer on the scores only" with no ``scores_only`` field), with the values of the row
    the table selects, and the summary's words follow the fields."""
    from mla_sink.kernels.gluon import tuning

    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--q-dtype", "bf16", "--kv-dtype", kv, "--heads",
                        str(heads), "--tokens", str(tokens), "--sms", "132", "--json")
    launch = json.loads(out)["launch"]
    arr = launch["gluon_fp8_arrangement"]
    want = tuning.fp8_arrangement(kv, "bf16", heads, launch["num_kv_splits"] > 1,
                                  tuning.cta_blocks(launch["ids_per_split"], 2048))
    assert code == 0 and arr["row"] == want.row
    for field in ("head_block", "consumer_regs", "producer_regs", "producer_rows", "lines", "deferred_row_sum",
                  "scores_only", "early_ids", "staged_ids", "warp_max", "rope_by_second",
                  "meta_by_second", "l2_prefetch", "producers", "producer_ahead", "pv_overlap"):
        assert arr[field] == getattr(want, field), field
    summary = arr["summary"]
    producers = "producer" if want.producers == 1 else f"{want.producers} producers (one a ring stage) each"
    assert f"second consumer {want.consumer_regs} / {producers} {want.producer_regs} registers" in summary
    assert f"{want.producer_rows} rows a producer step" in summary
    assert ("whole lines" in summary) == want.lines
    assert ("the L2 asked for 256 bytes a row load" in summary) == want.l2_prefetch
    assert ("on the scores only" in summary) == want.scores_only
    assert ("next step in flight" in summary) == want.producer_ahead
    assert ("half of P V in flight" in summary) == want.pv_overlap


@pytest.mark.parametrize("kv,heads,tokens,warp_max", [("fp8_ds_mla", 32, 256, True), ("fp8_ds_mla", 32, 64, True),
                                                       ("fp8_ds_mla", 32, 2, True), ("fp8_ds_mla", 16, 2, True),
                                                       ("fp8_e4m3", 32, 64, True), ("fp8_e4m3", 16, 2, True),
                                                       ("fp8_ds_mla", 16, 256, True), ("fp8_ds_mla", 16, 64, True),
                                                       ("fp8_e4m3", 32, 256, True), ("fp8_e4m3", 16, 256, True)])
def test_explain_json_says_whether_the_block_maximum_is_taken_per_warp(kv, heads, tokens, warp_max, capsys):
    """The first consumer takes each block's maximum per warp (``warp_max``, fifty-first session; every launch since
    the alternate blocks, which reduced theirs across warps, left the kernel in the seventy-sixth): a structured field
    and the summary say so."""
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--q-dtype", "bf16", "--kv-dtype", kv, "--heads",
                        str(heads), "--tokens", str(tokens), "--sms", "132", "--json")
    arr = json.loads(out)["launch"]["gluon_fp8_arrangement"]
    assert code == 0 and arr["warp_max"] is warp_max
    assert ("the block maximum per warp" in arr["summary"]) == warp_max


@pytest.mark.parametrize("heads,tokens,split,staged", [(16, 256, False, True), (32, 256, False, True),
                                                         (32, 64, True, True), (16, 64, True, False),
                                                         (32, 2, True, False), (16, 2, True, False)])
def test_explain_json_says_whether_the_ids_are_staged_by_the_producer(heads, tokens, split, staged, capsys):
    """e4m3's long id ranges read each block's checked ids from the producer's shared-memory copy (``staged_ids``,
    forty-first session): a structured field and the summary say so, as they do for ``early_ids``."""
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--q-dtype", "bf16", "--kv-dtype", "fp8_e4m3", "--heads",
                        str(heads), "--tokens", str(tokens), "--sms", "132", "--json")
    launch = json.loads(out)["launch"]
    arr = launch["gluon_fp8_arrangement"]
    assert code == 0 and (launch["num_kv_splits"] > 1) == split
    assert arr["staged_ids"] is staged
    assert ("ids staged by the producer" in arr["summary"]) == staged


@pytest.mark.parametrize("tokens,ranges", [(64, 1), (65535, 1), (65536, 2), (70000, 2), (131071, 3), (131064, 2)])
def test_explain_names_the_launches_of_a_call_beyond_the_grid_token_limit(tokens, ranges, capsys):
    """More tokens than a CUDA grid's y / z dimension holds (65535) run as one launch per token range of 65532 tokens
    (a multiple of 4: every range's 4-byte per-token rows stay 16-byte aligned); explain says how many (text, with or
    without an SM count) and gives them as ``launch.token_ranges`` (JSON)."""
    for sms in (("--sms", "132"), ()):
        argv = ("explain", "--arch", "sm90", "--heads", "32", "--kv-dtype", "fp8_ds_mla", "--q-dtype", "bf16",
                "--tokens", str(tokens), *sms)
        code, out = run_cli(capsys, *argv)
        said = [line for line in out.splitlines() if "token ranges" in line]
        assert code == 0 and said == ([] if ranges == 1 else [
            f"    the call runs as {ranges} launches, over token ranges of 65532 tokens, the last shorter (a CUDA "
            "grid's y / z dimension holds 65535)"])
        code, out = run_cli(capsys, *argv, "--json")
        assert code == 0 and json.loads(out)["launch"]["token_ranges"] == ranges


@pytest.mark.parametrize("arch", ["sm90", "cpu"])
def test_explain_a_call_of_no_tokens(arch, capsys):
    """``T = 0`` is a call the library takes (empty ``out`` and ``lse``), so explain takes ``--tokens 0`` too (it
    refused it until the thirty-second session): the path and its rows, and that nothing launches - no split, combine
    or arrangement line, which would describe launches that do not happen; the JSON's launch is null, with or
    without an SM count (a second break test: it gave a split count and a kernel)."""
    argv = ("explain", "--arch", arch, "--heads", "32", "--kv-dtype", "fp8_ds_mla", "--q-dtype", "bf16", "--tokens", "0",
            *(("--sms", "132") if arch == "sm90" else ()))
    code, out = run_cli(capsys, *argv)
    launch = [line for line in out.splitlines() if "triton launch" in line]
    assert code == 0 and len(launch) == 1 and launch[0].startswith("  triton launch at T=0: none (a call of no tokens")
    assert "KV split" not in out and "combine:" not in out and "arrangement:" not in out
    code, out = run_cli(capsys, *argv, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["num_tokens"] == 0 and doc["launch"] is None  # as on the AITER paths
    code, out = run_cli(capsys, *argv[:-2] if arch == "sm90" else argv)  # without --sms the same
    assert code == 0 and "triton launch at T=0: none (a call of no tokens launches nothing)" in out


def test_token_ranges_keep_every_range_16_byte_aligned():
    """Ranges of a multiple of 4 tokens below the bound; one range when the call fits; none without tokens."""
    from mla_sink.paths.triton.plan import MAX_GRID_TOKENS, token_ranges

    assert token_ranges(0) == [] and token_ranges(5) == [(0, 5)] and token_ranges(65535) == [(0, 65535)]
    assert token_ranges(65536) == [(0, 65532), (65532, 65536)]
    ranges = token_ranges(4 * 65535 + 10)
    assert all(b - a <= MAX_GRID_TOKENS and a % 4 == 0 for a, b in ranges) and ranges[-1][1] == 4 * 65535 + 10
    assert [b - a for a, b in ranges[:-1]] == [65532] * (len(ranges) - 1)
    assert token_ranges(7, limit=2) == [(0, 2), (2, 4), (4, 6), (6, 7)]  # a bound below 4 (tests lower it)


@pytest.mark.parametrize("argv,row,regs", [
    (["--kv-dtype", "fp8_ds_mla", "--heads", "64"], "ds_mla_producer_72", 72),
    (["--kv-dtype", "fp8_e4m3", "--heads", "128"], "e4m3_producer_80", 80),
    (["--kv-dtype", "bf16", "--heads", "64"], "half_producer_72", 72),
])
def test_explain_names_the_gluon_seesaw_producer_row(argv, row, regs, capsys):
    """A gluon_seesaw launch names its row of tables/gluon_seesaw.yaml, the producer's registers and why (text and
    JSON); a gluon_fp8 launch prints no producer line."""
    from mla_sink.kernels.gluon import tuning

    base = ["explain", "--arch", "sm90", "--q-dtype", "bf16", *argv, "--tokens", "256", "--sms", "132"]
    code, out = run_cli(capsys, *base)
    why = tuning.gluon_seesaw_table().row(row).why
    assert code == 0 and "kernel gluon_seesaw" in out
    assert [line.strip() for line in out.splitlines() if "producer: row" in line] == [
        f"producer: row {row} (tables/gluon_seesaw.yaml): {regs} registers (second consumer 216); {why}"]
    code, out = run_cli(capsys, *base, "--json")
    assert json.loads(out)["launch"]["gluon_seesaw_producer"] == dict(row=row, producer_regs=regs, consumer_regs=216,
                                                                      why=why)
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--kv-dtype", "fp8_e4m3", "--heads", "16", "--tokens",
                        "256", "--sms", "132")
    assert code == 0 and "kernel gluon_fp8" in out and "producer: row" not in out


def test_explain_triton_launch_without_sm_count(capsys):
    code, out = run_cli(capsys, "explain", "--arch", "sm80", "--heads", "16", "--aiter", "none")
    assert code == 0 and "row sm80_sm100_default (tables/triton_tuning.yaml)" in out and "pass --sms N" in out
    # without an SM count the kernel is not decided (a Gluon row needs the split count): not "portable"
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--heads", "16", "--kv-dtype", "fp8_ds_mla")
    assert code == 0 and "(SM count unknown): kernel not decided" in out and "kernel portable" not in out
    code, out = run_cli(capsys, "explain", "--arch", "gfx942", "--aiter", "0.1.20", "--heads", "64", "--sinks")
    assert "row rocm_default (tables/triton_tuning.yaml)" in out  # AMD shapes without an AITER kernel run the portable kernel


@pytest.mark.parametrize("argv", [["explain", "--q-dtype", "fp32"], ["explain", "--heads", "abc"],
                                  ["demo", "--dtype", "fp32"], ["explain", "--triton", "--no-triton"]])
def test_argparse_errors_are_one_line(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert len(err.strip().splitlines()) == 1 and "error: argument" in err and "usage:" not in err


@pytest.mark.parametrize("argv, prog, stray", [(["explain", "--bogus"], "mla-sink explain", "--bogus"),
                                               (["demo", "--tokens", "2", "stray"], "mla-sink demo", "stray"),
                                               (["info", "--x"], "mla-sink info", "--x"),
                                               (["--bogus", "explain"], "mla-sink", "--bogus")])
def test_unrecognized_arguments_are_named_by_the_command_they_follow(argv, prog, stray, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err == f"{prog}: error: unrecognized arguments: {stray} (see --help)\n"


def test_version(capsys):
    import re
    from pathlib import Path

    import mla_sink

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"mla-sink {mla_sink.__version__}"
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == mla_sink.__version__


@pytest.mark.parametrize("argv,text", [
    (["bench", "--dcp", "0"], "'--dcp' must be an int in [1, 2147483647] (got 0)"),
    (["bench", "--reps", "0"], "'--reps' must be an int in [1, 2147483647] (got 0)"),
    (["bench", "--replays", "-2"], "'--replays' must be an int in [1, 2147483647] (got -2)"),
    (["bench", "--pool-rows", "0"], "'--pool-rows' must be an int in [1, 2147483647] (got 0)"),
    (["bench", "--dcp", "2", "--tokens", "0"], "'--tokens' must be an int in [1, 2147483647] (got 0)"),
    (["bench", "--peer-max-tokens", "-1"], "'--peer-max-tokens' must be an int >= 0 (got -1)"),
    (["bench", "--ds-pages", "3"], "'--ds-pages' must be 0 (a flat [N, 656] cache) or a divisor of 64 (got 3)"),
    (["bench", "--ds-pages", "-64"], "'--ds-pages' must be 0 (a flat [N, 656] cache) or a divisor of 64 (got -64)"),
    (["bench", "--ds-pages", "64", "--host"],
     "'--ds-pages' applies to the kernel grid only, not to --host (got --ds-pages 64)"),
    (["bench", "--ds-pages", "64", "--dcp", "2"],
     "'--ds-pages' applies to the kernel grid only, not to --dcp > 1 (got --ds-pages 64)"),
    (["bench", "--ds-scale", "amax", "--host"],
     "'--ds-scale' applies to the kernel grid only, not to --host (got --ds-scale amax)"),
    (["bench", "--ds-scale", "amax", "--dcp", "2"],
     "'--ds-scale' applies to the kernel grid only, not to --dcp > 1 (got --ds-scale amax)"),
    (["bench", "--heads", "16"], "'--heads' applies to --dcp > 1 only, not to the kernel grid (got --heads 16)"),
    (["bench", "--host", "--topk", "256"], "'--topk' applies to --dcp > 1 only, not to --host (got --topk 256)"),
    (["bench", "--calls", "10"], "'--calls' applies to --host only, not to the kernel grid (got --calls 10)"),
    (["bench", "--dcp", "2", "--repeats", "3"], "'--repeats' applies to --host only, not to --dcp > 1 (got --repeats 3)"),
    # the kernel grid's flags in the other modes were dropped without a word (a fresh user's check, twenty-ninth
    # session)
    (["bench", "--dcp", "2", "--reps", "7"], "'--reps' applies to the kernel grid only, not to --dcp > 1 (got --reps 7)"),
    (["bench", "--dcp", "2", "--cases", "x"],
     "'--cases' applies to the kernel grid only, not to --dcp > 1 (got --cases x)"),
    (["bench", "--host", "--png", "x.png"], "'--png' applies to the kernel grid only, not to --host (got --png x.png)"),
    (["bench", "--host", "--replays", "3"],
     "'--replays' applies to the kernel grid only, not to --host (got --replays 3)"),
    (["bench", "--host", "--flush", "write"],
     "'--flush' applies to the kernel grid only, not to --host (got --flush write)"),
    (["bench", "--dcp", "2", "--peer-max-tokens", "2"],
     "'--peer-max-tokens' applies to the kernel grid only, not to --dcp > 1 (got --peer-max-tokens 2)"),
    (["bench", "--dcp", "2", "--no-peers"],
     "'--peers' applies to the kernel grid and --host only, not to --dcp > 1 (got --no-peers)"),
    (["bench", "--host", "--dcp", "2"],
     "'--host' and '--dcp 2' are two benchmarks; give one or the other"),
    (["bench", "--host", "--calls", "0"], "'--calls' must be an int in [1, 2147483647] (got 0)"),
    # an empty output path or case list passed the checks: on a GPU no file, or every case (fortieth session)
    (["bench", "--json", ""], "'--json' must not be empty (got ''); leave it out for no JSON file"),
    (["bench", "--png", " "], "'--png' must not be empty (got ' '); leave it out for no chart"),
    (["bench", "--cases", ""], "'--cases' must not be empty (got ''); leave it out for every case"),
    (["bench", "--cases", "h16,,h32"], "'--cases' must be names separated by commas, none empty (got 'h16,,h32')"),
    # the kernels take counts as int32; a bad --dcp is named before any flag is judged by the mode it picks (a fresh
    # user's check, twenty-ninth session)
    (["bench", "--pool-rows", "99999999999999"], "'--pool-rows' must be an int in [1, 2147483647] (got 99999999999999)"),
    (["bench", "--dcp", "2", "--heads", "3000000000"], "'--heads' must be an int in [1, 2147483647] (got 3000000000)"),
    (["bench", "--dcp", "0", "--heads", "8"], "'--dcp' must be an int in [1, 2147483647] (got 0)"),
    # written after the run: a path that cannot be written is refused before it (a fresh user's check, twenty-eighth
    # session: a traceback once the benchmark was done)
    (["bench", "--json", "/nonexistent-mla-sink/x.json"],
     "'--json' must be a file in an existing folder (got '/nonexistent-mla-sink/x.json': no folder "
     "'/nonexistent-mla-sink')"),
    (["bench", "--host", "--json", "/nonexistent-mla-sink/x.json"],
     "'--json' must be a file in an existing folder (got '/nonexistent-mla-sink/x.json': no folder "
     "'/nonexistent-mla-sink')"),
    (["bench", "--dcp", "2", "--json", "/nonexistent-mla-sink/x.json"],
     "'--json' must be a file in an existing folder (got '/nonexistent-mla-sink/x.json': no folder "
     "'/nonexistent-mla-sink')"),
    (["bench", "--png", "/"], "'--png' must name a file, not a folder (got '/')"),
])
def test_bench_flag_values_are_checked_before_the_gpu(argv, text, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"error: {text}" and "GPU" not in err


def test_demo_prints_one_key_for_the_call(capsys):
    from mla_sink.core.describe import describe
    from mla_sink.core.records import call_key
    from mla_sink.tools.demo import make_inputs

    for extra in ([], ["--path", "reference"]):
        code, out = run_cli(capsys, "demo", "--device", "cpu", "--tokens", "2", "--topk", "64", "--pool", "256", *extra)
        assert code == 0
        x = make_inputs(2, 16, 64, 256, "bf16", "bf16", "cpu", True)
        spec, platform = describe(x["q"], x["kv_cache"], x["indices"], x["sinks"], return_lse=True)
        key = call_key(spec, platform)
        assert out.count(key) == 1 and out.splitlines()[0].startswith(f"call: {key} ")
        assert str(spec) not in out  # CallSpec's own key (no arch) is not printed beside it


def test_demo_counts_the_rejected_rows_as_explain_json_lists_them(capsys):
    """The demo's "(n earlier rows rejected)" counted the explanation's lines, which group a path's rows on one line
    (3 where 14 rows were rejected; fortieth session's break test); it counts the rows, as ``explain --json``
    lists them (``rejected`` and each ``rejected_paths`` entry's ``rows``)."""
    import re

    code, out = run_cli(capsys, "demo", "--device", "cpu", "--tokens", "2", "--topk", "64", "--pool", "256")
    assert code == 0
    shown = int(re.search(r"\((\d+) earlier rows rejected", out).group(1))
    code, text = run_cli(capsys, "explain", "--arch", "cpu", "--heads", "16", "--sinks", "--return-lse", "--json")
    doc = json.loads(text)
    rows = len(doc["rejected"]) + sum(len(p["rows"]) for p in doc["rejected_paths"])
    assert code == 0 and shown == rows and rows > 3


def test_explain_json_leaves_the_kernel_open_without_an_sm_count(capsys):
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--heads", "128", "--json")
    launch = json.loads(out)["launch"]
    assert code == 0 and launch["num_kv_splits"] is None and launch["kernel"] is None
    assert "kernel_file" in launch and launch["kernel_file"] is None  # every triton document has the key
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--heads", "128", "--json", "--sms", "132", "--tokens", "256")
    launch = json.loads(out)["launch"]
    assert (launch["kernel"], launch["kernel_file"]) == ("gluon_seesaw", "mla_sink/kernels/gluon/gluon_seesaw.py")


def test_explain_prints_the_combine_tile_of_a_split_launch(capsys):
    """A split launch's text explain names the combine's tile and program count, from the plan (a fresh user's
    check, twenty-eighth session: the tile was in --json only); an unsplit launch has no combine line."""
    args = ["explain", "--arch", "sm90", "--triton", "--heads", "16", "--kv-dtype", "fp8_ds_mla", "--topk", "2048",
            "--sms", "132", "--sinks"]
    code, out = run_cli(capsys, *args, "--tokens", "2", "--json")
    launch = json.loads(out)["launch"]
    assert code == 0 and launch["num_kv_splits"] > 1
    h, d = launch["combine_block_h"], launch["combine_block_d"]
    code, out = run_cli(capsys, *args, "--tokens", "2")
    programs = 2 * -(-16 // h) * (512 // d)
    assert code == 0 and f"    combine: {h} heads x {d} value columns a program, {programs} programs" in out
    code, out = run_cli(capsys, *args, "--tokens", "256")
    assert code == 0 and "1 KV split(s)" in out and "combine:" not in out


def test_bench_peers_flag_needs_flash_mla(monkeypatch, capsys):
    import sys
    import types

    monkeypatch.setitem(sys.modules, "flash_mla", None)  # import flash_mla raises ImportError
    code = main(["bench", "--peers"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: '--peers' needs FlashMLA importable (flash_mla not importable: ")
    assert "GPU" not in err
    monkeypatch.setitem(sys.modules, "flash_mla", types.ModuleType("flash_mla"))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # never start the bench itself
    code = main(["bench", "--peers"])
    err = capsys.readouterr().err
    assert code == 2 and "--peers" not in err and err.strip() == "error: mla-sink bench needs a CUDA GPU"
    code = main(["bench", "--no-peers", "--reps", "0"])  # --no-peers never imports; other flags still checked
    assert code == 2 and "'--reps' must be an int in [1, 2147483647]" in capsys.readouterr().err


@pytest.mark.parametrize("argv,mode,expected", [
    (["bench"], "grid", dict(pool_rows=3_500_000, reps=10, replays=7, flush="read", cases="", png="",
                             peer_max_tokens=256, ds_pages=0, ds_scale="pow2", peers=None)),
    (["bench", "--reps", "3", "--pool-rows", "5000"], "grid", dict(reps=3, pool_rows=5000, replays=7)),
    # the DCP benchmark's own pool whichever way it is started (mla-sink bench gave it the grid's 3.5M rows)
    (["bench", "--dcp", "2"], "dcp", dict(pool_rows=1 << 22, heads=128, tokens=64, topk=2048, reps=None,
                                          cases=None)),
    (["bench", "--host", "--no-peers"], "host", dict(pool_rows=3_500_000, calls=300, repeats=11, peers=False,
                                                     reps=None)),
])
def test_bench_modes_get_their_own_defaults(argv, mode, expected, monkeypatch):
    """Each mode's flags get that mode's defaults, and the flags it does not read stay unset (a fresh user's check,
    twenty-ninth session)."""
    from mla_sink.tools import bench, dcp_bench, host_bench

    seen = {}

    def capture(name):
        def run(args):
            seen[name] = vars(args)
            return 0
        return run

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr(dcp_bench, "run_dcp_bench", capture("dcp"))
    monkeypatch.setattr(host_bench, "cmd_host_bench", capture("host"))
    monkeypatch.setattr(bench, "run_bench", lambda args: (capture("grid")(args), {})[1])
    monkeypatch.setattr(bench, "print_table", lambda report: None)
    assert main(argv) == 0 and list(seen) == [mode]
    assert {k: seen[mode][k] for k in expected} == expected


def _matplotlib_or_a_stand_in(monkeypatch) -> None:
    """matplotlib where it is installed; elsewhere (CI installs the ``test`` extra, not ``bench``) a stand-in
    ``matplotlib.figure`` whose figures write what a default matplotlib build writes, so that the check of ``--png``
    runs in CI too (the test skipped there until the forty-first session)."""
    import sys
    import types

    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        formats = {ext: ext.upper() for ext in ("eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg",
                                                "svgz", "tif", "tiff", "webp")}
        canvas = types.SimpleNamespace(get_supported_filetypes=lambda: dict(formats))
        figure = types.ModuleType("matplotlib.figure")
        figure.Figure = lambda: types.SimpleNamespace(canvas=canvas)
        package = types.ModuleType("matplotlib")
        package.figure = figure
        monkeypatch.setitem(sys.modules, "matplotlib", package)
        monkeypatch.setitem(sys.modules, "matplotlib.figure", figure)


def test_bench_png_is_a_chart_matplotlib_writes(monkeypatch, capsys):
    """``--png`` with an extension matplotlib cannot write, or without matplotlib, is refused before the grid (it
    failed after the whole run; a fresh user's check, twenty-ninth session); a known extension, or none, passes."""
    import sys

    _matplotlib_or_a_stand_in(monkeypatch)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # a passing check reaches the GPU test
    assert main(["bench", "--png", "chart.txt"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: '--png' must name a chart file matplotlib writes (") and "png" in err
    assert err.endswith("got 'chart.txt')")
    for good in ("chart.png", "chart.svg", "chart"):
        assert main(["bench", "--png", good]) == 2 and "needs a CUDA GPU" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import raises ImportError
    assert main(["bench", "--png", "chart.png"]) == 2
    assert capsys.readouterr().err.startswith("error: '--png' needs matplotlib (")


def test_bench_peers_and_no_peers_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "--peers", "--no-peers"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "not allowed with argument" in err and len(err.strip().splitlines()) == 1


def test_explain_does_not_give_a_gluon_kernel_the_portable_tiles(capsys):
    """The Gluon kernels fix their own tiles: explain says so, and names the portable row's tiles as the
    fallback's, instead of printing them as the launch's."""
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--heads", "128", "--tokens", "256", "--sms", "132")
    assert code == 0 and "kernel gluon_seesaw" in out
    assert "1 KV split(s) of 2048 ids; the kernel's own tiles (on a fallback to the portable kernel: BLOCK_H=64" in out
    code, out = run_cli(capsys, "explain", "--arch", "sm90", "--heads", "16", "--tokens", "256", "--sms", "132")
    assert code == 0 and "kernel portable" in out and "ids; BLOCK_H=16 BLOCK_N=64" in out


def test_explain_on_the_cpu_names_the_interpreter_not_sms(capsys):
    """The CPU runs the Triton kernels through the interpreter: explain says so instead of an SM count."""
    code, out = run_cli(capsys, "explain", "--arch", "cpu", "--aiter", "none", "--triton", "--heads", "16")
    assert code == 0
    assert "triton launch at T=64 (Triton's CPU interpreter): kernel portable" in out
    assert "SM(s)" not in out


def test_a_table_with_a_gap_or_a_misnamed_table_is_one_error_line(capsys, tmp_path, monkeypatch):
    """An edited mla_decode.yaml without its catch-all row made ``explain`` print a TableCheckError traceback
    (an AssertionError, outside the CLI's ValueError handling), and one whose ``table:`` was renamed loaded (break
    test, thirty-third session): each is now ``error: ...`` on stderr, exit 2."""
    from mla_sink.core import select, tables

    shipped = tables.table_path("mla_decode").read_text()
    edits = {"gap": shipped.replace("    when:\n      triton: true\n    path: triton\n",
                                    "    when:\n      triton: true\n      arch: sm90\n    path: triton\n", 1),
             "renamed": shipped.replace("table: mla_decode\n", "table: something_else\n", 1)}
    assert all(text != shipped for text in edits.values())
    for case, text in edits.items():
        path = tmp_path / f"{case}.yaml"
        path.write_text(text)
        monkeypatch.setattr(tables, "table_path", lambda name, path=path: path)
        select.mla_table.cache_clear()
        try:
            code = main(["explain", "--arch", "cpu", "--heads", "16"])
        finally:
            select.mla_table.cache_clear()
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and "Traceback" not in err, (case, err)
        assert ("'table' must be 'mla_decode'" in err) if case == "renamed" else ("gap" in err.lower()), (case, err)


def test_the_readme_explain_examples_are_what_explain_prints(capsys):
    """Each line of README.md's ``$ mla-sink explain ...`` examples is a line the command prints, its elisions
    (``...``, ``(...)``) aside: a break test (thirty-third session) found a reason there that the table no longer
    gives."""
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    starts = [i for i, line in enumerate(readme) if line.startswith("$ mla-sink explain ")]
    assert len(starts) >= 2
    for i in starts:
        code = main(shlex.split(readme[i])[2:])
        out = capsys.readouterr().out.splitlines()
        assert code == 0, readme[i]
        shown_lines = []
        for line in readme[i + 1:]:
            if line.startswith(("```", "$ ")):
                break
            shown_lines.append(line)
        # an example without a line of its own saying "..." shows every line printed (the first example lacked one
        # the table had gained: fortieth session's break test)
        if not any(line.strip() == "..." for line in shown_lines):
            assert len(shown_lines) == len(out), (readme[i], len(shown_lines), len(out))
        for line in shown_lines:
            pieces = [p for p in re.split(r"\(\.\.\.\)|\.\.\.", line) if p.strip()]
            if not pieces:
                continue

            def shown(o: str) -> bool:
                at = 0
                for piece in pieces:
                    at = o.find(piece, at)
                    if at < 0:
                        return False
                    at += len(piece)
                return line.lstrip().startswith("...") or o.startswith(pieces[0])  # same indentation

            assert any(shown(o) for o in out), (readme[i], line)


@pytest.mark.parametrize("value,shown", [("-inf", "-inf"), ("-nan", "nan"), ("-1e400", "-inf")])
def test_a_negative_non_number_logit_cap_gets_the_librarys_message(value, shown, capsys):
    # a break test's finding: argparse took "-inf" after --logit-cap for a flag ("expected one argument")
    assert main(["explain", "--arch", "cpu", "--logit-cap", value]) == 2
    assert capsys.readouterr().err.strip() == f"error: --logit-cap: 'logit_cap' must be a finite float (got {shown})"


@pytest.mark.parametrize("flag", ["--logit", "--logit-c"])
def test_an_abbreviated_logit_cap_flag_takes_a_negative_value(flag, capsys):
    """argparse accepts ``--logit`` for ``--logit-cap``; its ``-inf`` / ``-1e3`` were read as flags (a break test,
    forty-third session)."""
    assert main(["explain", "--arch", "cpu", flag, "-inf"]) == 2
    assert capsys.readouterr().err.strip() == "error: --logit-cap: 'logit_cap' must be a finite float (got -inf)"
    assert main(["explain", "--arch", "cpu", flag, "-1e3"]) == 0  # a cap <= 0: no cap
    assert capsys.readouterr().out.splitlines()[0] == "bf16-h16-cpu-nosinks-dcp1"


@pytest.mark.parametrize("argv,message", [
    (["explain", "--arch", "cpu", "--topk", "-1e3"], "argument --topk: invalid int value: '-1e3'"),
    (["explain", "--arch", "cpu", "--heads", "-2.5"], "argument --heads: invalid int value: '-2.5'"),
    (["demo", "--tokens", "-1e3"], "argument --tokens: invalid int value: '-1e3'"),
    (["explain", "--arch", "cpu", "--json", "-1e3"], "argument --json: ignored explicit argument '-1e3'"),
])
def test_a_negative_number_after_any_flag_is_named_as_its_value(argv, message, capsys):
    """A value such as ``-1e3`` after an int flag was read by argparse as a flag ("expected one argument", no value
    named: a "left as known" item); it is now the flag's value, which the flag's own
    parser names."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_negative_logit_cap_still_means_no_cap_and_a_missing_value_is_still_refused(capsys):
    assert main(["explain", "--arch", "cpu", "--logit-cap", "-1", "--heads", "16"]) == 0
    assert "→" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:  # argparse's own refusal: the next token is a flag, not a number
        main(["explain", "--arch", "cpu", "--logit-cap", "--heads", "16"])
    assert info.value.code == 2 and "argument --logit-cap: expected one argument" in capsys.readouterr().err


@pytest.mark.parametrize("cap", ["1e-400", "4.9e-325"])
def test_a_positive_logit_cap_below_every_float_is_refused_not_read_as_no_cap(cap, capsys):
    # sixty-third session's break test: float("1e-400") is 0.0, which the flag read as no cap
    assert main(["explain", "--arch", "cpu", "--logit-cap", cap, "--heads", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --logit-cap: 'logit_cap' must be <= 0 (no cap) or in [2^-126, 2^126]"), err
    assert err.count("\n") == 0 and len(err) < 300
    assert main(["explain", "--arch", "cpu", "--logit-cap", "-1e-400", "--heads", "16"]) == 0  # negative: no cap
    with pytest.raises(SystemExit) as info:  # argparse's refusal names the type as before, not the helper
        main(["explain", "--arch", "cpu", "--logit-cap", "", "--heads", "16"])
    assert info.value.code == 2 and "argument --logit-cap: invalid float value: ''" in capsys.readouterr().err


@pytest.mark.parametrize("argv,flags", [
    (["explain", "--arch", "cpu", "--q-dtype", "fp8_e4m3", "--kv-dtype", "bf16"], "--q-dtype/--kv-dtype"),
    (["demo", "--dtype", "fp16", "--kv-dtype", "bf16"], "--q-dtype/--kv-dtype"),
    (["demo", "--q-dtype", "fp16", "--kv-dtype", "bf16"], "--q-dtype/--kv-dtype"),
])
def test_a_refused_dtype_pair_names_both_flags(argv, flags, capsys):
    # thirty-ninth session's break test: every other refusal starts with its flag, the dtype pair's named none
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {flags}: ") and "must be one of" in err and err.count("\n") == 0


@pytest.mark.parametrize("argv,status,unbuffered", [
    (["explain", "--arch", "sm80", "--kv-dtype", "fp8_e4m3"], 2, ""),
    (["explain", "--arch", "sm80", "--kv-dtype", "fp8_e4m3", "--json"], 2, "1"),
    (["explain"], 0, ""),
    (["explain", "--matrix", "--json"], 0, "1"),
])
def test_output_into_a_closed_pipe_keeps_the_commands_status(argv, status, unbuffered):
    """``mla-sink explain ... | true``: the reader is gone before the command writes. A refusal exited 0 or 120 (the
    interrupted command's status, or Python's failed flush at exit, with 'Exception ignored ... BrokenPipeError' on
    stderr) instead of 2, and an answer 120 instead of 0 (fortieth session's break test)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    proc = subprocess.Popen([sys.executable, "-m", "mla_sink", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader quits before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == status, err
    assert "BrokenPipeError" not in err and "Traceback" not in err, err


def test_tables_command_checks_every_shipped_table(capsys):
    """``mla-sink tables`` checks each table as its reader loads it; every ``tables/*.yaml`` has a reader there (a
    break test, fortieth session: no command checked an edited table, which most readers load lazily)."""
    from pathlib import Path

    from mla_sink.tools.cli import table_readers

    shipped = {p.stem for p in (Path(__file__).resolve().parents[1] / "tables").glob("*.yaml")}
    assert {name for name, _ in table_readers()} == shipped
    code, out = run_cli(capsys, "tables")
    assert code == 0 and [line.split(":")[0] for line in out.splitlines()] == [f"✓ {n}" for n, _ in table_readers()]


def _tables_command_with(capsys, monkeypatch, tmp_path, name: str, text: str):
    """``mla-sink tables`` with ``tables/<name>.yaml`` read as ``text``: every reader's cached table is dropped before
    and after, so the edited one is loaded and no later test sees it. Returns ``(exit code, captured output)``."""
    import mla_sink.core.tables as tables_mod
    from mla_sink.core.dtypes import _call_dtypes
    from mla_sink.core.platform import interpreter_table
    from mla_sink.core.select import mla_table
    from mla_sink.kernels.gluon.tuning import _load as gluon_tables
    from mla_sink.paths.triton.plan import dcp_merge_table, tuning_table
    from mla_sink.tools.peers import peers_table

    edited = tmp_path / f"{name}.yaml"
    edited.write_text(text)
    real = tables_mod.table_path
    monkeypatch.setattr(tables_mod, "table_path", lambda n: edited if n == name else real(n))
    caches = (tuning_table, dcp_merge_table, mla_table, gluon_tables, peers_table, interpreter_table, _call_dtypes)
    for cached in caches:
        cached.cache_clear()
    try:
        code = main(["tables"])
        return code, capsys.readouterr()
    finally:
        monkeypatch.undo()
        for cached in caches:
            cached.cache_clear()


def test_tables_command_names_a_broken_table_and_exits_2(capsys, monkeypatch, tmp_path):
    """A table with its last row removed (a gap) fails: its line names the checker's problem, stderr one error line,
    exit 2; the other tables still report."""
    from mla_sink.core.tables import table_path

    text = table_path("peers").read_text()
    code, captured = _tables_command_with(capsys, monkeypatch, tmp_path, "peers",
                                          text[:text.rindex("  - id:")])  # the catch-all row gone
    assert code == 2
    assert "✗ peers: " in captured.out and "✓ mla_decode:" in captured.out
    from mla_sink.tools.cli import table_readers

    assert captured.err.strip() == f"error: 1 of {len(table_readers())} tables failed their checks: peers"


def test_the_readme_use_example_runs_as_written():
    """README's first Python example ("Use"), extracted and run as written on the CPU: the function and the layer
    give the same answer, equal to the float64 reference within bf16's budget (a break test found the example
    using tensors it never made)."""
    from pathlib import Path

    import torch

    from mla_sink.core.reference import sparse_mla_decode_reference

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = text.index("```python\nimport torch\nfrom mla_sink import sparse_mla_decode, SparseMLADecode")
    start += len("```python\n")
    ns: dict = {}
    exec(compile(text[start:text.index("```", start)], "README.md", "exec"), ns)  # noqa: S102 - the example as written
    out_fn, _ = ns["sparse_mla_decode"](ns["q"], ns["kv_cache"], ns["indices"], sinks=ns["sinks"])
    ref, ref_lse = sparse_mla_decode_reference(ns["q"], ns["kv_cache"], ns["indices"], ns["sinks"])
    assert torch.equal(ns["out"], out_fn)
    torch.testing.assert_close(ns["out"].double(), ref.double(), atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(ns["lse"].double(), ref_lse.double(), atol=1e-4, rtol=1e-5)


def test_the_readme_fp8_ds_mla_example_runs_after_the_use_example():
    """README's second Python example (the 656-byte V3.2 cache), run as written after the first, whose q, indices
    and sinks it uses (a break test found it quantising a ``kv`` it never made): equal to the float64 reference on
    the exactly dequantised cache within bf16's budget."""
    from pathlib import Path

    import torch

    import mla_sink
    from mla_sink.core.reference import sparse_mla_decode_reference

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    ns: dict = {}
    for head in ("```python\nimport torch\nfrom mla_sink import sparse_mla_decode, SparseMLADecode",
                 "```python\nimport mla_sink\n\nkv = "):
        start = text.index(head) + len("```python\n")
        exec(compile(text[start:text.index("```", start)], "README.md", "exec"), ns)  # noqa: S102 - as written
    assert ns["kv_cache"].dtype == torch.uint8 and ns["kv_cache"].shape == (ns["N"], 656)
    kv = mla_sink.dequantize_kv_cache(ns["kv_cache"])
    ref, ref_lse = sparse_mla_decode_reference(ns["q"], kv, ns["indices"], ns["sinks"])
    torch.testing.assert_close(ns["out"].double(), ref.double(), atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(ns["lse"].double(), ref_lse.double(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("argv,line", [
    (["demo", "--path", "aiter_lse"], "error: --path aiter_lse: no row of tables/mla_decode.yaml serves this call here"),
    (["explain", "--arch", "cpu", "--heads", "16", "--path", "aiter_persistent"],
     "error: --path aiter_persistent: no row of tables/mla_decode.yaml serves this call here"),
    (["explain", "--arch", "sm80", "--q-dtype", "fp8_e4m3", "--kv-dtype", "fp8_e4m3", "--heads", "16"],
     "error: the call is refused by row fp8_needs_sm89 of tables/mla_decode.yaml"),
])
def test_a_refused_call_puts_one_error_line_on_stderr(argv, line, capsys):
    """A refused call prints its explanation on stdout and one ``error:`` line on stderr (a break test: a script
    reading stderr saw nothing of a refused ``--path``, and the explanation never named the flag)."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "✗ " in captured.out
    assert captured.err.startswith(line) and captured.err.count("\n") == 1


PORTABLE_DESCRIPTION = "  portable:\n    description: the portable Triton kernel"
MERGE_PATH = "  merge:\n    description: the combine kernel"
ANY_GPU_PARAMS = "    params: {combine_block_h: 16, combine_block_d: 128}\n"


@pytest.mark.parametrize("name,old,new,message", [
    # a refusal row in the tuning table: KeyError None out of the reader's check (a traceback, not exit 2)
    ("triton_tuning", "rows:\n", "rows:\n  - id: too_new\n    when: {arch: sm120}\n    refuse: not measured\n"
     "    why: w\n    source: s\n", r"triton_tuning.yaml:\d+: row 'too_new': the tuning table has no refusal rows"),
    # a path default the planner cannot read passed the check (it read the row's own params), and the first plan of
    # a portable call raised KeyError 'foo'
    ("triton_tuning", PORTABLE_DESCRIPTION, "  portable:\n    params: {foo: 1}\n    description: the portable Triton "
     "kernel", r"triton_tuning.yaml:\d+: row 'cpu_interpreter': a portable row gives exactly the params .*"
     r"unknown \['foo'\]"),
    ("triton_tuning", "  gluon_seesaw:\n    requires:", "  gluon_seesaw:\n    params: {BLOCK_N: 64}\n    requires:",
     r"triton_tuning.yaml:\d+: row 'sm90_bf16_gluon_seesaw_few_heads': a Gluon row takes no params"),
    # the same in the DCP merge's table: a path default unknown to dcp_merge_tile was accepted
    ("dcp_merge", MERGE_PATH, "  merge:\n    params: {combine_block_w: 4}\n    description: the combine kernel",
     r"dcp_merge.yaml:\d+: row 'cpu_interpreter': a merge row gives exactly the params"),
    # a gap at a head count the domain skips: the loader's grid passed it, and explain --arch cpu --heads 20 then
    # ended in a LookupError traceback (a break test, forty-third session)
    ("triton_tuning", "  - id: cpu_interpreter\n    when: {arch: cpu}\n",
     "  - id: cpu_interpreter\n    when: {arch: cpu, num_heads: {ne: 20}}\n",
     r"problem\(s\) at values beside its thresholds:\n.*\[error: gap\].*num_heads=20"),
    # below the smallest declared value: topk's domain started at 1000, so a gap at topk < 64 passed (a break test)
    ("triton_tuning", "  - id: cpu_interpreter\n    when: {arch: cpu}\n",
     "  - id: cpu_interpreter\n    when: {arch: cpu, topk: {ge: 64}}\n",
     r"\[error: gap\].*topk=(1|63)\b"),
    # an arch no row names: the catch-all rows limited to the declared archs passed, and explain --arch sm86 then
    # found no row; rows split between two AITER releases passed, and AITER 0.1.16 found none (break tests,
    # fifty-third session)
    ("mla_decode", "  - id: triton_portable\n    when:\n      triton: true\n",
     "  - id: triton_portable\n    when:\n      triton: true\n"
     "      arch: [gfx942, gfx950, gfx90a, sm80, sm89, sm90, sm100, cpu]\n",
     r"problem\(s\) at values beside its thresholds:\n.*\[error: gap\].*arch=<unlisted>"),
    ("mla_decode", "  - id: triton_portable\n    when:\n      triton: true\n",
     "  - id: triton_portable\n    when:\n      triton: true\n"
     "      aiter_version: {not_in: [\"0.1.15.post1\"]}\n",
     r"\[error: gap\].*aiter_version=0\.1\.15\.post1"),
    # a misspelt target inside an in-list: the row silently missed gfx950 (a break test, forty-third session)
    ("mla_decode", "  - id: fp8_ds_mla_amd_triton\n    when:\n      arch: [gfx942, gfx950]\n",
     "  - id: fp8_ds_mla_amd_triton\n    when:\n      arch: [gfx942, gfx95O]\n",
     r"mla_decode.yaml:\d+: row 'fp8_ds_mla_amd_triton': arch in names gfx95O, not in the field's declared domain"),
    # a path the runtime cannot launch loaded, and a call it won failed naming --path (a break test, forty-third
    # session); a refusal row binding the reference refused in select what plan_call runs
    ("mla_decode", "  reference:\n    description:", "  aiter_new:\n    description: new\n  reference:\n"
     "    description:", r"mla_decode.yaml:\d+: path 'aiter_new' is not one its reader serves \(aiter_persistent, "),
    ("mla_decode", "    paths: [triton]\n", "    paths: [triton, reference]\n",
     r"mla_decode.yaml:\d+: row 'fp8_needs_sm89': a refusal row cannot bind 'reference'"),
    # the single-path tables: a row naming an unknown path was served as the real one (a break test)
    ("dcp_merge", MERGE_PATH, "  nccl_merge:\n    description: x\n" + MERGE_PATH,
     r"dcp_merge.yaml:\d+: path 'nccl_merge' is not one its reader serves \(merge\)"),
    ("gluon_seesaw", "paths:\n", "paths:\n  bogus_path:\n    description: x\n",
     r"gluon_seesaw.yaml:\d+: path 'bogus_path' is not one its reader serves \(gluon_seesaw\)"),
    ("peers", "paths:\n", "paths:\n  bogus_path:\n    description: x\n",
     r"peers.yaml:\d+: path 'bogus_path' is not one its reader serves \(call\)"),
    ("triton_interpreter", "paths:\n", "paths:\n  bogus_path:\n    description: x\n",
     r"triton_interpreter.yaml:\d+: path 'bogus_path' is not one its reader serves \(interpreter\)"),
    # the dtype pairs' table (forty-sixth session's break test): an fp8 q writing its own dtype, one q with two
    # output dtypes (which passed `tables` and then failed every call) and a misspelt param were accepted
    ("call_dtypes", "    params: {out_dtype: bf16}\n", "    params: {out_dtype: q}\n",
     r"call_dtypes.yaml:\d+: row 'fp8_q' must give out_dtype 'q' \(for a half q\) or one of \['bf16', 'fp16'\]"),
    ("call_dtypes", "  - id: half_q\n", "  - {id: x, when: {q_dtype: fp16, kv_dtype: fp8_ds_mla}, path: served, "
     "params: {out_dtype: bf16}, why: w, source: s}\n  - id: half_q\n",
     r"call_dtypes.yaml:\d+: row '(x|half_q)' gives q fp16 the output (bf16|fp16), another row (fp16|bf16)"),
    ("call_dtypes", "    params: {out_dtype: bf16}\n", "    params: {out_dtyp: bf16}\n",
     r"call_dtypes.yaml:\d+: row 'fp8_q' gives \['out_dtyp'\]; its one param is 'out_dtype'"),
    ("call_dtypes", "    type: str\n    closed: true\n    domain: [bf16, fp16, fp8_e4m3, fp8_e4m3fnuz]\n",
     "    type: str\n    domain: [bf16, fp16, fp8_e4m3, fp8_e4m3fnuz]\n",
     r"call_dtypes.yaml: field 'q_dtype' must be a closed domain of"),
])
def test_tables_command_checks_the_params_a_reader_reads(capsys, monkeypatch, tmp_path, name, old, new, message):
    """The reader's checks see what its lookups read (a row's params merged with its path's defaults) and refuse a
    refusal row the reader cannot serve, with file, line and row, exit 2 and no traceback (break test, tables
    session)."""
    from mla_sink.core.tables import table_path
    from mla_sink.tools.cli import table_readers

    text = table_path(name).read_text()
    assert text.count(old) == 1
    code, captured = _tables_command_with(capsys, monkeypatch, tmp_path, name, text.replace(old, new))
    assert code == 2 and f"error: 1 of {len(table_readers())} tables failed their checks: {name}" in captured.err
    assert re.search(message, captured.out), captured.out


def test_a_path_default_the_merge_rows_leave_to_it_is_read():
    """A merge row may leave a param to its path's default, as dcp_merge_tile reads the merged params (the check
    read the row's own params and refused such a row: break test, tables session)."""
    from mla_sink import dispatch
    from mla_sink.core.tables import table_path
    from mla_sink.paths.triton.plan import _check_merge_rows

    text = table_path("dcp_merge").read_text()
    assert text.count(MERGE_PATH) == 1 and text.count(ANY_GPU_PARAMS) == 1
    table = dispatch.load_table(text.replace(ANY_GPU_PARAMS, "").replace(
        MERGE_PATH, "  merge:\n" + ANY_GPU_PARAMS + "    description: the combine kernel"), name="dcp_merge.yaml")
    _check_merge_rows(table)
    assert table.select({"arch": "sm90"}).params == {"combine_block_h": 16, "combine_block_d": 128}
