"""``mla-sink explain`` against what the library plans and launches for the same call (the forty-first session's break
test of the promise "``mla-sink explain`` prints which kernel path a call takes and why").

For a broad sample of calls - every arch the tables declare, every allowed (q, KV) dtype pair, head counts 1-256 with
odd ones, T from 0 to beyond a CUDA grid's token limit, topk with and without whole 16-id rows, sinks, DCP,
``return_lse``, a soft cap, a forced path, an SM count or none, AITER versions - the test runs ``mla-sink explain``
(text and ``--json``, in this process) and the library's own entry points on CPU tensors of that call, with the
platform of that arch given (the tensors' arch read as that arch):

* the function's execute (:func:`mla_sink.api._prepare_call`: validate, describe, select, plan, then the path's
  launcher preparing its runner), with the launchers' kernel launches recorded instead of compiled - so what is
  compared is the kernel the launcher would launch, not only the plan it was given;
* :func:`mla_sink.run` with DCP (a stand-in process group of that many ranks, the collectives recorded);
* :func:`mla_sink.prepare` (the layer's construction-time check).

Then explain's path, row, params, spec, platform, kernel, split count, tiles, tuning rows and AITER call must be the
runtime's, and a call explain refuses must be refused by the runtime (``NoKernelError`` with explain's own text), one
it accepts must not be. Malformed calls are refused by both with a ``ValueError`` naming the argument; ``--matrix``
(text and JSON) must give every cell the path ``explain`` gives that call; the demo's explanation must be that of
the call it runs.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
from typing import Any, Optional
from unittest import mock

import attrs
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from mla_sink import api
from mla_sink.core.dtypes import FP8_KEYS, TORCH_DTYPES, allowed_dtype_pairs
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.kv_layout import span_bytes
from mla_sink.core.platform import _triton_available
from mla_sink.core.records import CallSpec, Platform, call_key
from mla_sink.core.select import KNOWN_PATHS, NoKernelError
from mla_sink.paths.aiter.chunks import AiterChunkedCall, resolve_calls
from mla_sink.paths.aiter.plan import AiterCall, with_meta_param
from mla_sink.paths.triton.plan import MAX_GRID_TOKENS
from mla_sink.tools.cli import MATRIX_DTYPES, MATRIX_HEADS, _ABBREV, main, matrix_platforms
from mla_sink.tools.explain import KERNEL_FILES

ARCHS = ("sm80", "sm89", "sm90", "sm100", "gfx942", "gfx950", "gfx90a", "cpu")
PAIRS = tuple(sorted(allowed_dtype_pairs()))
HEADS = (1, 2, 3, 5, 7, 8, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 100, 127, 128, 129, 256)
TOKENS = (0, 1, 2, 3, 4, 7, 8, 9, 64, 256, 4096, MAX_GRID_TOKENS, MAX_GRID_TOKENS + 1, 140000)
TOPKS = (1, 15, 16, 37, 63, 64, 65, 128, 1000, 2047, 2048, 2049)
#: the most index entries a sampled call allocates (contiguous int32 indices: their row stride is what the seesaw's
#: launcher checks, so they are real tensors, not broadcast views)
MAX_IDS = 1 << 22
#: the LSE the recorded runners return (a DCP decode refuses a path that returns none)
NO_DATA = torch.empty(0)


def cli(argv: list) -> tuple:
    """``mla-sink`` in this process: ``(status, stdout, stderr)``."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@attrs.frozen
class Call:
    arch: str
    aiter: Optional[str]
    triton: Optional[bool]  # None: the flag left out (this machine's)
    q: str
    kv: str
    heads: int
    tokens: int
    topk: int
    sinks: bool
    dcp: int
    return_lse: bool
    cap: float
    path: Optional[str]
    sms: Optional[int]
    packed: bool = True  # kv_cache's rows packed (contiguous), or a view of wider rows
    # tensors whose gather strides are not all multiples of the tuning table's 16 (CallSpec.gather_aligned false):
    # "q" a view of [T, H, 580] rows, "kv" a cache of row stride 580, "idx" indices of row stride topk + 4;
    # "idx_step" indices whose rows are not unit-stride (CallSpec.unit_rows false)
    strides: Optional[str] = None
    pool_rows: int = 8  # kv_cache's rows; a pool past 2^32 bytes is allocated lazily (torch.empty: no page touched)

    def argv(self) -> list:
        a = ["explain", "--arch", self.arch, "--aiter", self.aiter or "none", "--q-dtype", self.q, "--kv-dtype",
             self.kv, "--heads", str(self.heads), "--tokens", str(self.tokens), "--topk", str(self.topk),
             "--dcp", str(self.dcp), "--logit-cap", repr(self.cap)]
        if self.triton is not None:
            a.append("--triton" if self.triton else "--no-triton")
        a += ["--sinks"] * self.sinks + ["--return-lse"] * self.return_lse
        a += ["--path", self.path] if self.path else []
        a += ["--sms", str(self.sms)] if self.sms is not None else []
        a += [] if self.packed and self.strides != "kv" else ["--no-kv-rows-packed"]  # rows of 580 are not packed
        a += ["--no-unit-rows"] if self.strides == "idx_step" else []
        a += ["--no-gather-aligned"] if self.strides in ("q", "kv", "idx") else []
        a += ["--kv-cache-bytes", str(span_bytes(tensors(self).kv_cache))]  # as the runtime reads it
        return a

    def platform(self) -> Optional[Platform]:
        """The platform a call on a device of this arch plans for: on the CPU the detected one (None: the library
        detects it), with Triton off where the call says so; elsewhere the record of such a machine (Gluon as
        Triton: it imports wherever Triton does here)."""
        if self.arch == "cpu":
            return None if self.triton is None else Platform("cpu", triton=self.triton, gluon=False, num_sms=1)
        triton = _triton_available() if self.triton is None else self.triton
        return Platform(self.arch, aiter_version=self.aiter, triton=triton, num_sms=self.sms)


@st.composite
def calls(draw) -> Call:
    arch = draw(st.sampled_from(ARCHS + ("sm90",) * 3))  # sm90 has the most rows (the Gluon kernels)
    amd = arch.startswith("gfx")
    q, kv = draw(st.sampled_from(PAIRS))
    tokens = draw(st.sampled_from(TOKENS))
    topk = draw(st.sampled_from([k for k in TOPKS if max(tokens, 1) * k <= MAX_IDS]))
    return Call(
        arch=arch, aiter=draw(st.sampled_from((None, "0.1.18", "0.1.19", "0.1.20"))) if amd else None,
        triton=draw(st.sampled_from((None, None, None, False))), q=q, kv=kv, heads=draw(st.sampled_from(HEADS)),
        tokens=tokens, topk=topk, sinks=draw(st.booleans()), dcp=draw(st.sampled_from((1, 1, 1, 2, 4))),
        return_lse=draw(st.booleans()), cap=draw(st.sampled_from((0.0, 0.0, -1.0, 30.0))),
        path=draw(st.sampled_from((None, None, None) + KNOWN_PATHS)),
        sms=None if arch == "cpu" else draw(st.sampled_from((None, 1, 78, 132, 304))))


def tensors(c: Call) -> DecodeInputs:
    """CPU tensors of the call (their values never matter: no kernel runs). q is a broadcast view (its strides are
    aligned either way); the indices are contiguous ``[T, topk]``, as engines pass them; the cache is contiguous, or
    for a call without packed rows a view of rows 64 elements wider (row stride 640 for ``[N, 576]``)."""
    if c.strides == "q":  # q = buf[..., :576] of a [T, H, 580] buffer: head stride 580
        q = torch.zeros(c.tokens, c.heads, 580, dtype=TORCH_DTYPES[c.q])[..., :576]
    else:
        q = torch.zeros(1, c.heads, 576, dtype=TORCH_DTYPES[c.q]).expand(c.tokens, c.heads, 576)
    width = 656 if c.kv == "fp8_ds_mla" else 576
    wide = width + (4 if c.strides == "kv" else 0 if c.packed else 64)  # rows of 580 (660), or of 640 (720)
    make = torch.zeros if c.pool_rows <= 8 else torch.empty  # a big pool's pages are never touched: no kernel runs
    kv = make(c.pool_rows, wide, dtype=TORCH_DTYPES[c.kv])[:, :width]
    if c.strides == "idx":  # indices of row stride topk + 4
        idx = torch.zeros(c.tokens, c.topk + 4, dtype=torch.int32)[:, :c.topk]
    elif c.strides == "idx_step":  # rows of stride 2
        idx = torch.zeros(c.tokens, 2 * c.topk, dtype=torch.int32)[:, ::2]
    else:
        idx = torch.zeros(c.tokens, c.topk, dtype=torch.int32)
    return DecodeInputs(q=q, kv_cache=kv, indices=idx,
                        sm_scale=576 ** -0.5, sinks=torch.zeros(c.heads) if c.sinks else None,
                        q_scale=torch.ones(1) if c.q in FP8_KEYS else None,
                        kv_scale=torch.ones(1) if c.kv in FP8_KEYS else None, logit_cap=c.cap)


class Recorder:
    """Patches the library so that its entry points run on CPU tensors as on a device of ``arch``: the tensors' arch
    reads as ``arch``; the runners the launchers prepare record what they would launch (the Triton kernels by name,
    the reference, the AITER call after AITER's split heuristic - the contract fake's) instead of launching it;
    DCP's process group is a stand-in of ``dcp`` ranks and its collectives are not run."""

    def __init__(self, arch: str, dcp: int) -> None:
        self.arch, self.dcp = arch, dcp
        self.plans: list = []  # every plan a runner was prepared for
        self.dcp_plans: list = []  # every plan a DCP call's rank-local decode was made for
        self.launched: list = []  # what the prepared runners would launch

    @contextlib.contextmanager
    def active(self):
        import mla_sink.core.dcp as dcp_mod
        import mla_sink.core.dcp_run as dcp_run
        import mla_sink.paths as paths
        import mla_sink.paths.aiter.launch as aiter_launch
        import mla_sink.paths.triton.launch as triton_launch
        from aiter_contract import AiterContractFake

        real_prepare, real_local = paths.prepare_runner, dcp_run.local_decode_fp32
        fake = AiterContractFake(arch=self.arch if self.arch.startswith("gfx") else "gfx942")

        def prepare_runner(plan, x):  # the path's launcher prepares its runner (recording what it would launch);
            self.plans.append(plan)  # the runner itself is not run: its outputs (T x H x 512) may not fit here
            if plan.path == "reference":
                self.launched.append("reference")
            real_prepare(plan, x)
            return lambda x, *a: (None, NO_DATA)

        def local_decode(plan):
            self.dcp_plans.append(plan)
            return real_local(plan)

        def run_dcp(local, inputs, **kwargs):  # this rank's decode (its runner prepared), no collective
            T, H, _ = inputs.q.shape
            if T * H * 512 * 4 <= 1 << 27:  # the fp32 partial it allocates
                local(inputs)

        def gluon_launches(kernel, *args, **kwargs):
            self.launched.append(kernel)
            return (lambda *a: None), (lambda *a: None)

        def portable_runner(plan, launch, *args):
            self.launched.append(launch.kernel)
            return lambda *a: None

        def aiter_runner(call, inputs, *args):  # the launcher's checks of the inputs against the call run (a cache
            aiter_launch._check_inputs(call, inputs)  # AITER's launcher refuses must not be planned on AITER)
            self.launched.append(call)
            return lambda *a: None

        patches = [
            mock.patch.object(api, "arch_of", lambda device: self.arch),
            mock.patch.object(paths, "prepare_runner", prepare_runner),
            mock.patch.object(triton_launch, "_gluon_launches", gluon_launches),
            mock.patch.object(triton_launch, "_portable_runner", portable_runner),
            mock.patch.object(aiter_launch, "load_aiter_impl", lambda: fake),
            mock.patch.object(aiter_launch, "_call_runner", aiter_runner),
            mock.patch.object(dcp_mod, "group_size_rank", lambda group, name="group", **kw: (self.dcp, 0)),
            mock.patch.object(dcp_run, "local_decode_fp32", local_decode),
            mock.patch.object(dcp_run, "prepare_runner", prepare_runner),
            mock.patch.object(dcp_run, "run_dcp", run_dcp),
        ]
        with contextlib.ExitStack() as stack:
            for p in patches:
                stack.enter_context(p)
            self.fake = fake
            api.forget_prepared_calls()  # a signature prepared before would skip the planning compared here
            try:
                yield self
            finally:
                api.forget_prepared_calls()


def runtime(c: Call) -> tuple:
    """What the library does with the call: ``("ok", plan, launched, token-free plan)``, ``("refused",
    NoKernelError)`` or ``("invalid", ValueError)``."""
    x = tensors(c)
    rec = Recorder(c.arch, c.dcp)
    with rec.active():
        try:
            if c.dcp > 1:
                spec = CallSpec(q_dtype=c.q, kv_dtype=c.kv, num_heads=c.heads, topk=c.topk, sinks=c.sinks,
                                dcp_world_size=c.dcp, need_lse=c.return_lse, logit_cap=c.cap)
                api.run(spec, x, platform=c.platform(), path=c.path, dcp_group=object(), num_kv_rows=8 * c.dcp)
            else:
                api.sparse_mla_decode(x.q, x.kv_cache, x.indices, x.sinks, q_scale=x.q_scale, kv_scale=x.kv_scale,
                                      return_lse=c.return_lse, logit_cap=c.cap, platform=c.platform(), path=c.path)
            plans = rec.plans if c.dcp == 1 else rec.dcp_plans
            plan = plans[0]
            assert all(p == plan and p.launch == plan.launch for p in rec.plans + rec.dcp_plans), rec.plans
            spec = plan.spec
            token_free = api.prepare(spec, plan.platform, path=c.path)  # the layer's construction-time plan
        except NoKernelError as e:
            return "refused", e
        except ValueError as e:
            return "invalid", e
    launched_known = c.dcp == 1 or bool(rec.plans)
    return "ok", plan, rec.launched if launched_known else None, token_free, rec.fake


def check_agreement(c: Call) -> None:
    rc, text, err = cli(c.argv())
    rc_json, js, err_json = cli(c.argv() + ["--json"])
    assert (rc, err) == (rc_json, err_json), c
    got = runtime(c)
    if got[0] == "invalid":
        raise AssertionError(f"a valid call refused by the runtime's validation: {got[1]} ({c})")
    if got[0] == "refused":
        # the explanation on stdout, one error line on stderr (the refusal row, or no row; with --path, naming it)
        assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, (c, err, got[1])
        row = got[1].selection.row
        assert (f"refused by row {row.id} " in err) if row is not None else ("no row of " in err), (c, err)
        assert text.rstrip("\n") == got[1].explanation  # the same explanation, word for word
        doc = json.loads(js)
        assert doc["refused"] and doc["path"] is None and doc["key"] == text.splitlines()[0]
        return
    _, plan, launched, token_free, fake = got
    assert rc == 0 and not err, (c, text, err)
    doc = json.loads(js)
    lines = text.splitlines()
    # the call, the platform and the rule table's choice
    assert doc["key"] == lines[0] == call_key(plan.spec, plan.platform)
    assert doc["spec"] == attrs.asdict(plan.spec) and doc["need_lse"] == plan.spec.need_lse
    open_sms = c.sms is None and c.arch != "cpu"  # explain leaves a GPU's SM count open; the runtime reads its device's
    open_splits = plan.path == "triton" and open_sms
    assert doc["platform"] == dict(attrs.asdict(plan.platform), **({"num_sms": None} if open_sms else {})), c
    assert (doc["path"], doc["num_tokens"]) == (plan.path, c.tokens)
    row = doc["row"]["id"] if isinstance(doc["row"], dict) else doc["row"]
    assert row == plan.row_id and doc["params"] == dict(plan.params)
    assert (token_free.path, token_free.row_id) == (plan.path, plan.row_id)
    if plan.path == "reference" and plan.row_id == "forced":
        assert lines[1].startswith("  → reference   (forced"), text
    else:
        assert any(x.startswith(f"  → {plan.path}") and x.endswith(f"(row {plan.row_id})") for x in lines), text
    # the launch (``launched`` None: a DCP call whose rank-local decode was too large to prepare here, its plan only)
    if plan.path == "reference":
        assert launched in (["reference"], None) and doc["launch"] is None
    elif plan.path == "triton":
        if c.tokens == 0:
            assert launched in ([], None) and doc["launch"] is None and "none (a call of no tokens" in text
        elif open_splits:
            assert doc["launch"]["kernel"] is None and doc["launch"]["num_kv_splits"] is None
            assert "kernel not decided" in text
        else:
            check_triton_launch(c, plan.launch, launched, doc["launch"], text)
    elif c.tokens == 0:  # an AITER path: a call of no tokens launches nothing
        assert launched in ([], None) and doc["launch"] is None and "aiter call at T=0: none" in text
    elif isinstance(plan.launch, AiterChunkedCall):  # more id slots than one AITER call indexes: token chunks
        check_chunked_aiter_launch(c, plan.launch, launched, doc["launch"], text, fake)
    else:  # an AITER path: the call AITER gets, after AITER's split heuristic (the contract fake's here)
        # explain, without AITER here, leaves AITER's own pick open and says so; the runtime's plan may carry it
        # resolved (a plan made while AITER - the contract fake - was importable: one of another platform record
        # than explain's, such as a DCP call's, whose SM count is the device's), so the call explain prints is the
        # runtime's with that pick open again
        said = plan.launch if plan.launch.min_kv_splits is None else attrs.evolve(plan.launch, num_kv_splits=None)
        assert f"  aiter call at T={c.tokens}: {said}" in lines and doc["launch"] == attrs.asdict(said), (c, text)
        if said.needs_meta_param:
            assert "split count: max(AITER's own heuristic" in text
            n, _ = fake.get_meta_param(None, c.tokens, c.tokens * said.topk, said.padded_heads, 1,
                                       TORCH_DTYPES[said.q_dtype])
            said = with_meta_param(said, (int(n), c.tokens))
        assert plan.launch.needs_meta_param or plan.launch == said, (plan.launch, said)
        if launched is not None:
            (call,) = launched
            assert isinstance(call, AiterCall) and call == said, (call, said)


def _split_pick_open(call: AiterCall) -> AiterCall:
    """``call`` as explain plans it without AITER here: AITER's own split pick (``min_kv_splits`` set) left open."""
    return call if call.min_kv_splits is None else attrs.evolve(call, num_kv_splits=None)


def check_chunked_aiter_launch(c: Call, launch: AiterChunkedCall, launched: Optional[list], doc: dict, text: str,
                               fake: Any) -> None:
    """A call of more id slots than one AITER call indexes: explain says it is served in N calls over token chunks
    and why (text and JSON), with each chunk length's call; the runtime prepares exactly those calls, each with
    AITER's split pick (the contract fake's) for that chunk's own batch size."""
    said = resolve_calls(launch, _split_pick_open)
    lines = text.splitlines()
    n = len(said.chunks)
    assert f"  aiter call at T={c.tokens}: {said}" in lines, (c, text)
    tokens = f"{said.chunk_tokens} token{'s' if said.chunk_tokens != 1 else ''}"
    assert f"served in {n} calls over token chunks of {tokens}" in text and said.why in text
    assert said.why.startswith(f"T * topk = {c.tokens} * {c.topk} = {c.tokens * c.topk} id slots exceed ")
    full = n - (len(said.calls) - 1)
    each = " each" if full > 1 else ""
    assert f"    {full} chunk{'s' if full > 1 else ''} of {tokens}{each}: {said.calls[0]}" in lines, (c, text)
    if len(said.calls) == 2:
        last = said.calls[1].num_tokens
        assert f"    the last chunk, of {last} token{'s' if last != 1 else ''}: {said.calls[1]}" in lines, (c, text)
    assert ("split count: max(AITER's own heuristic" in text) == said.needs_meta_param
    record = json.loads(json.dumps(attrs.asdict(said)))  # the calls as a JSON list
    common = dict(path=said.path, row_id=said.row_id, num_heads=said.num_heads, topk=said.topk,
                  out_dtype=said.out_dtype, return_lse=said.return_lse)  # as a single call's launch has them
    assert doc == dict(record, num_chunks=n, chunk_tokens=said.chunk_tokens, why=said.why, **common), (c, doc)

    def picked(call: AiterCall) -> AiterCall:
        if not call.needs_meta_param:
            return call
        k, _ = fake.get_meta_param(None, call.num_tokens, call.num_tokens * call.topk, call.padded_heads, 1,
                                   TORCH_DTYPES[call.q_dtype])
        return with_meta_param(call, (int(k), call.num_tokens))

    resolved = resolve_calls(said, picked)
    assert launch.needs_meta_param or launch == resolved, (launch, resolved)
    if launched is not None:  # one runner per chunk length: the full chunks' call, then a shorter last one's
        assert launched == list(resolved.calls), (c, launched)


def check_triton_launch(c: Call, launch: Any, launched: list, doc: dict, text: str) -> None:
    """The Triton launch explain prints (text and JSON) is the planned one, and the one the launcher runs."""
    ranges = -(-c.tokens // (MAX_GRID_TOKENS - MAX_GRID_TOKENS % 4)) if c.tokens > MAX_GRID_TOKENS else 1
    # every runner prepared (one per distinct token-range length) launches the planned kernel; the seesaw with an
    # exact recompute launches twice, gluon_fp8 prepares its plain-load twin: each names the kernel
    assert launched is None or (launched and set(launched) == {launch.kernel}), (c, launch.kernel, launched)
    for name in ("kernel", "kernel_row", "tuning_row", "num_kv_splits", "ids_per_split", "block_h", "block_n",
                 "num_warps", "num_stages", "combine_block_h", "combine_block_d", "fp8_f16", "exact_recompute",
                 "fallback", "per_call"):
        assert doc[name] == getattr(launch, name), (name, c)
    assert doc["kernel_file"] == KERNEL_FILES[launch.kernel] and doc["token_ranges"] == ranges
    assert [tuple(r) for r in doc["rejected_kernels"]] == [tuple(r) for r in launch.rejected_kernels]
    assert f"kernel {launch.kernel} ({KERNEL_FILES[launch.kernel]})" in text
    assert f"    {launch.num_kv_splits} KV split(s) of {launch.ids_per_split} ids" in text
    assert f"row {launch.tuning_row} (tables/triton_tuning.yaml)" in text
    assert ("    combine: " in text) == (launch.num_kv_splits > 1)
    assert (f"runs as {ranges} launches" in text) == (ranges > 1)
    assert ("    fallback: " in text) == (launch.fallback is not None)
    assert ("    recompute: " in text) == launch.exact_recompute
    assert ("    per call: " in text) == (launch.per_call is not None) == (launch.kernel == "gluon_seesaw")
    for row, why in launch.rejected_kernels:
        assert f"    ✗ {row}: {why}" in text


@settings(max_examples=250, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(calls())
def test_explain_says_what_the_runtime_plans_and_launches(c):
    check_agreement(c)


#: the (q, KV) dtype pairs AITER serves on each AMD arch (tables/mla_decode.yaml, the AITER rows)
AITER_PAIRS = {"gfx942": (("bf16", "bf16"), ("fp8_e4m3fnuz", "fp8_e4m3fnuz")),
               "gfx950": (("bf16", "bf16"), ("fp8_e4m3", "fp8_e4m3"))}


@st.composite
def aiter_calls(draw) -> Call:
    """Calls an AITER row may serve: gfx942 / gfx950 with an AITER at or past the floor, its dtype pairs, no soft cap,
    the table's choice or an AITER path forced. :func:`calls` draws so many archs, dtype pairs, versions, caps and
    forced paths that none of its 250 examples reached an AITER path (forty-first session's break test), which left
    the AITER launch records to the four named calls below."""
    arch = draw(st.sampled_from(sorted(AITER_PAIRS)))
    q, kv = draw(st.sampled_from(AITER_PAIRS[arch]))
    tokens = draw(st.sampled_from(TOKENS))
    topk = draw(st.sampled_from([k for k in TOPKS if max(tokens, 1) * k <= MAX_IDS]))
    aiter_paths = tuple(p for p in KNOWN_PATHS if p.startswith("aiter"))
    return Call(arch=arch, aiter=draw(st.sampled_from(("0.1.19", "0.1.20"))), triton=draw(st.sampled_from((None, False))),
                q=q, kv=kv, heads=draw(st.sampled_from(HEADS)), tokens=tokens, topk=topk, sinks=draw(st.booleans()),
                dcp=draw(st.sampled_from((1, 1, 2, 4))), return_lse=draw(st.booleans()),
                cap=draw(st.sampled_from((0.0, -1.0))), path=draw(st.sampled_from((None, None, None) + aiter_paths)),
                sms=draw(st.sampled_from((None, 256, 304))), packed=draw(st.sampled_from((True, True, False))))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(aiter_calls())
def test_explain_says_what_the_runtime_plans_and_launches_on_aiter(c):
    check_agreement(c)


def check_aiter_receives_the_explained_call(c: Call, said: AiterCall) -> None:
    """Run the call for real through the library on the contract fake (the AITER launcher's runner not replaced) and
    check that ``mla_decode_fwd`` gets what explain printed: the padded heads, persistent metadata or not,
    ``return_lse``, the split count (where explain names one) and, for a fixed non-persistent count, its ``num_kv_splits_indptr``."""
    from aiter_contract import AiterContractFake
    import mla_sink.paths.aiter.launch as aiter_launch

    fake = AiterContractFake(arch=c.arch)
    x = tensors(c)
    x = x._replace(q=x.q.contiguous(), kv_cache=torch.randn(8, 576).to(x.kv_cache.dtype),
                   sinks=torch.zeros(c.heads) if c.sinks else None)
    with mock.patch.object(api, "arch_of", lambda device: c.arch), \
            mock.patch.object(aiter_launch, "load_aiter_impl", lambda: fake):
        api.forget_prepared_calls()
        try:
            api.sparse_mla_decode(x.q, x.kv_cache, x.indices, x.sinks, q_scale=x.q_scale, kv_scale=x.kv_scale,
                                  return_lse=c.return_lse, platform=c.platform(), path=c.path)
        finally:
            api.forget_prepared_calls()
    (got,) = fake.calls
    assert (got["nhead"], got["persistent"], got["return_lse"]) == (
        said.padded_heads, said.persistent, said.return_lse), (c, got, said)
    assert said.num_kv_splits in (None, got["num_kv_splits"]), (c, got, said)  # None: AITER's own pick
    assert got["num_kv_splits_arg"] == said.num_kv_splits and got["max_seqlen_q"] == 1, (c, got)
    assert got["num_kv_splits_indptr_given"] == (not said.persistent and said.num_kv_splits is not None), (c, got)


def test_explain_agrees_with_the_runtime_on_every_aiter_row():
    """Every AITER row of the table, reached by a call of its arch, dtypes and heads (with and without sinks, with and
    without DCP), is planned and launched as explain says: each row's call is recorded at its launch."""
    from mla_sink.core.select import mla_table

    launched_rows = set()
    for arch, pairs in sorted(AITER_PAIRS.items()):
        for (q, kv), heads, sinks, dcp in itertools.product(pairs, (1, 16, 17, 32, 48, 64, 128), (False, True), (1, 2)):
            c = Call(arch, "0.1.20", None, q, kv, heads, 3, 37, sinks, dcp, False, 0.0, None, None)
            check_agreement(c)
            got = runtime(c)
            if got[1].path.startswith("aiter"):
                assert got[2] and isinstance(got[2][0], AiterCall), (c, got[2])
                launched_rows.add(got[1].row_id)
                if dcp == 1:
                    check_aiter_receives_the_explained_call(c, got[2][0])
    assert launched_rows == {r.id for r in mla_table().rows if r.path and r.path.startswith("aiter")}


@pytest.mark.parametrize("c", [
    # the seesaw at a topk that is not a multiple of 16 ids: explain named gluon_seesaw, the launcher ran the portable
    # kernel (contiguous indices then have a row stride the seesaw's gather does not take); now the plan says so
    Call("sm90", None, None, "bf16", "bf16", 128, 4, 1000, False, 1, False, 0.0, None, 132),
    Call("sm90", None, None, "bf16", "bf16", 64, 256, 2047, True, 1, False, 0.0, None, 132),
    Call("sm90", None, None, "bf16", "fp8_ds_mla", 128, 2, 2049, True, 1, False, 0.0, None, 132),
    Call("sm90", None, None, "fp16", "fp8_e4m3", 64, 64, 37, False, 1, True, 0.0, None, 132),
    Call("sm90", None, None, "bf16", "bf16", 5, 3, 100, True, 1, False, 0.0, "triton", 132),
    Call("sm90", None, None, "bf16", "bf16", 128, 4, 1024, False, 1, False, 0.0, None, 132),  # aligned: the seesaw
    Call("sm90", None, None, "bf16", "fp8_ds_mla", 16, 2, 1000, True, 1, False, 0.0, None, 132),  # gluon_fp8: any topk
    # beyond a grid's token limit: one launch per token range, each of the planned kernel
    Call("sm90", None, None, "bf16", "bf16", 128, MAX_GRID_TOKENS + 5, 16, True, 1, False, 0.0, None, 132),
    Call("cpu", None, None, "bf16", "bf16", 3, MAX_GRID_TOKENS + 1, 16, True, 1, False, 0.0, None, None),
    # AITER: AITER's own split count, forced to at least two, is left open by explain and resolved at the launch
    Call("gfx942", "0.1.20", None, "fp8_e4m3fnuz", "fp8_e4m3fnuz", 16, 256, 2048, True, 1, False, 0.0, None, 304),
    Call("gfx950", "0.1.20", None, "fp8_e4m3", "fp8_e4m3", 24, 8, 2048, False, 1, True, 0.0, None, 256),
    Call("gfx950", "0.1.20", None, "bf16", "bf16", 32, 2, 2048, True, 2, False, 0.0, None, 256),
    Call("gfx942", "0.1.20", None, "bf16", "bf16", 5, 0, 2048, True, 1, False, 0.0, "aiter_lse", 304),
    # DCP with the SM count left open: the runtime's platform record takes the device's count, so its plan is not the
    # one explain cached, and was made with AITER (the contract fake) importable: its split count came resolved,
    # explain's stays open (the comparison took the runtime's resolved call for the one explain must print)
    Call("gfx942", "0.1.19", None, "fp8_e4m3fnuz", "fp8_e4m3fnuz", 1, 1, 1, False, 2, False, 0.0, None, None),
    Call("gfx942", "0.1.20", None, "fp8_e4m3fnuz", "fp8_e4m3fnuz", 128, 3, 37, True, 4, False, 0.0, None, None),
])
def test_explain_agrees_with_the_runtime_on_named_calls(c):
    check_agreement(c)


#: the id slots one AITER call takes, lowered (2^31 ids do not fit here): 37-id calls run in chunks of 2 tokens
LOW_ID_SLOTS = 100


@pytest.fixture
def lowered_id_slot_limit():
    """The AITER planner's bound :data:`~mla_sink.paths.aiter.plan.MAX_ID_SLOTS` lowered to :data:`LOW_ID_SLOTS` for
    explain and the runtime alike (both plan through it), the plan and runner caches cleared before and after."""
    import mla_sink.core.plan as plan_mod
    import mla_sink.paths.aiter.plan as aiter_plan

    def forget() -> None:
        plan_mod._build_plan_cached.cache_clear()
        api.forget_prepared_calls()

    real = aiter_plan.MAX_ID_SLOTS
    aiter_plan.MAX_ID_SLOTS = LOW_ID_SLOTS
    forget()
    try:
        yield LOW_ID_SLOTS
    finally:
        aiter_plan.MAX_ID_SLOTS = real
        forget()


@pytest.mark.parametrize("c", [
    Call("gfx942", "0.1.20", None, "bf16", "bf16", 16, 9, 37, True, 1, False, 0.0, None, 304),  # 4 x 2 + 1
    Call("gfx942", "0.1.20", None, "bf16", "bf16", 5, 8, 37, False, 1, True, 0.0, None, 304),  # 4 x 2, no rest
    Call("gfx942", "0.1.20", None, "fp8_e4m3fnuz", "fp8_e4m3fnuz", 16, 7, 37, True, 1, False, 0.0, None, 304),
    Call("gfx950", "0.1.20", None, "bf16", "bf16", 17, 5, 37, False, 1, False, 0.0, None, 256),  # persistent
    Call("gfx950", "0.1.20", None, "fp8_e4m3", "fp8_e4m3", 24, 3, 37, True, 2, False, 0.0, None, 256),  # DCP
    Call("gfx942", "0.1.20", None, "bf16", "bf16", 16, 2, 37, True, 1, False, 0.0, None, 304),  # fits: one call
    Call("gfx942", "0.1.20", None, "bf16", "bf16", 16, 0, 37, True, 1, False, 0.0, None, 304),  # no tokens
])
def test_explain_says_an_aiter_call_past_the_id_slot_bound_runs_in_the_chunks_the_runtime_runs(
        c, lowered_id_slot_limit):
    """A call of more id slots (T * topk) than one AITER call indexes was refused by the AITER planner at run time
    ("call with fewer tokens") while explain named the AITER path for it. Now both serve it in token chunks: explain
    (text and --json) says how many and why, and the runtime prepares each chunk length's AITER call."""
    check_agreement(c)
    _, plan, launched, _, _ = runtime(c)
    if c.tokens * c.topk > LOW_ID_SLOTS:
        assert isinstance(plan.launch, AiterChunkedCall) and plan.launch.max_id_slots == LOW_ID_SLOTS
        assert plan.launch.chunks[0] == (0, LOW_ID_SLOTS // c.topk) and plan.launch.chunks[-1][1] == c.tokens
        doc = json.loads(cli(c.argv() + ["--json"])[1])
        assert doc["launch"]["num_chunks"] == len(plan.launch.chunks) == -(-c.tokens // (LOW_ID_SLOTS // c.topk))
    else:
        assert not isinstance(plan.launch, AiterChunkedCall)


def test_a_chunked_aiter_call_through_the_library_equals_the_reference(lowered_id_slot_limit):
    """End to end on the contract fake (the fake's own int32 bound lowered too): the function API of a gfx942 call
    in 5 chunks, on adversarial ids, gives the float64 reference's result."""
    from aiter_contract import AiterContractFake
    import mla_sink.paths.aiter.launch as aiter_launch
    from mla_sink.core.reference import sparse_mla_decode_reference

    fake = AiterContractFake(arch="gfx942", max_id_slots=LOW_ID_SLOTS)
    g = torch.Generator().manual_seed(7)
    T, H, N, K = 9, 16, 40, 37
    q = torch.randn(T, H, 576, generator=g).bfloat16()
    kv = torch.randn(N, 576, generator=g).bfloat16()
    idx = torch.randint(0, N, (T, K), generator=g, dtype=torch.int32)
    idx[0, ::3], idx[2:4] = -1, N + 2  # -1 mid-row; a whole chunk (tokens 2-3) of ids past N
    sinks = torch.tensor([float("inf"), float("-inf")] + [0.5] * (H - 2))
    with mock.patch.object(api, "arch_of", lambda device: "gfx942"), \
            mock.patch.object(aiter_launch, "load_aiter_impl", lambda: fake):
        out, lse = api.sparse_mla_decode(q, kv, idx, sinks, platform=Platform("gfx942", aiter_version="0.1.20"))
    assert [call["batch"] for call in fake.calls] == [2, 2, 2, 2, 1]
    ref_out, ref_lse = sparse_mla_decode_reference(q, kv, idx, sinks, 576 ** -0.5)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse.float(), atol=2e-3, rtol=1e-4)
    assert torch.all(out[2:4] == 0) and torch.all(lse[2:4] == float("-inf"))


@pytest.mark.parametrize("c", [
    Call("gfx942", "0.1.20", None, "bf16", "bf16", 16, 4, 37, True, 1, False, 0.0, None, 304, packed=False),
    Call("gfx950", "0.1.20", None, "bf16", "bf16", 64, 3, 37, False, 1, False, 0.0, None, 256, packed=False),
    Call("gfx942", "0.1.20", None, "fp8_e4m3fnuz", "fp8_e4m3fnuz", 64, 2, 37, True, 1, False, 0.0, None, 304,
         packed=False),
    Call("gfx950", "0.1.20", None, "fp8_e4m3", "fp8_e4m3", 32, 3, 37, True, 2, False, 0.0, None, 256, packed=False),
    Call("gfx942", "0.1.20", False, "bf16", "bf16", 16, 4, 37, True, 1, False, 0.0, None, 304, packed=False),
    Call("gfx942", "0.1.20", None, "bf16", "bf16", 16, 4, 37, True, 1, False, 0.0, "aiter_lse", 304, packed=False),
    Call("gfx942", "0.1.20", None, "bf16", "bf16", 16, 4, 37, True, 1, False, 0.0, None, 304),  # packed: AITER
])
def test_a_call_on_a_cache_of_strided_rows_runs_where_explain_says(c):
    """A ``[N, 576]`` view of rows of 640 (rows not packed): explain named an AITER path while the AITER launcher
    refused the cache at run time ("'kv_cache' must be contiguous"). The AITER paths now require packed rows
    (``kv_rows_packed``, tables/mla_decode.yaml), read from the call's cache: explain (``--no-kv-rows-packed``) and
    the runtime both take the Triton path (the reference without Triton), naming that requirement as the AITER
    paths' reason; forced onto an AITER path, both refuse the call."""
    check_agreement(c)
    rc, text, _ = cli(c.argv())
    got = runtime(c)
    if c.packed:
        assert got[1].path.startswith("aiter") and got[1].spec.kv_rows_packed
        return
    assert "kv_rows_packed=false, needs true (mla-sink hands AITER the cache as kv_cache.view(" in text, text
    assert text.splitlines()[0].endswith("-kvstrided")  # the call's key says so
    if c.path is not None:  # forced onto an AITER path: refused by both, with the reason
        assert rc == 2 and got[0] == "refused" and "kv_rows_packed=false" in got[1].explanation
        return
    _, plan, launched, _, _ = got
    assert plan.spec.kv_rows_packed is False and plan.path == ("triton" if c.triton is None else "reference")
    assert call_key(plan.spec, plan.platform) == text.splitlines()[0]
    assert launched is None or not any(isinstance(x, AiterCall) for x in launched)


#: Rows of a bf16 [N, 576] pool just past 2^32 bytes (1152 bytes a row), and the most within it.
OVER_4GIB_ROWS, WITHIN_4GIB_ROWS = 2 ** 32 // 1152 + 1, 2 ** 32 // 1152


@pytest.mark.parametrize("c", [
    Call("gfx950", "0.1.20", None, "bf16", "bf16", 16, 4, 37, True, 1, False, 0.0, None, 256, pool_rows=OVER_4GIB_ROWS),
    Call("gfx950", "0.1.20", None, "bf16", "bf16", 32, 3, 37, True, 1, False, 0.0, None, 256, pool_rows=OVER_4GIB_ROWS),
    Call("gfx950", "0.1.20", None, "bf16", "bf16", 128, 2, 37, True, 1, False, 0.0, None, 256,
         pool_rows=OVER_4GIB_ROWS),
    Call("gfx942", "0.1.20", None, "bf16", "bf16", 16, 4, 37, False, 1, False, 0.0, None, 304,
         pool_rows=OVER_4GIB_ROWS),
    Call("gfx942", "0.1.20", False, "bf16", "bf16", 16, 4, 37, True, 1, False, 0.0, None, 304,
         pool_rows=OVER_4GIB_ROWS),
    Call("gfx942", "0.1.20", None, "bf16", "bf16", 16, 4, 37, True, 1, False, 0.0, "aiter_lse", 304,
         pool_rows=OVER_4GIB_ROWS),
    Call("gfx942", "0.1.20", None, "fp8_e4m3fnuz", "fp8_e4m3fnuz", 64, 2, 37, True, 1, False, 0.0, None, 304,
         pool_rows=2 ** 32 // 576 + 1),  # fp8: 576 bytes a row
    Call("gfx950", "0.1.20", None, "bf16", "bf16", 16, 4, 37, True, 1, False, 0.0, None, 256,
         pool_rows=WITHIN_4GIB_ROWS),  # the last pool within 2^32 bytes: AITER
])
def test_a_call_on_a_pool_past_4_gib_runs_where_explain_says(c):
    """AITER's MLA decode kernels read rows past 2^32 bytes from the pool's first byte from the wrong memory
    (ROCm/aiter#5765; tables/mla_decode.yaml, the AITER paths' ``kv_cache_bytes``). A pool past 4 GiB (allocated
    lazily: no page is touched, no kernel runs) is planned on Triton (the reference without Triton) by explain and
    the runtime alike, which name that requirement as the AITER paths' reason; forced onto an AITER path, both refuse
    the call; the largest pool within 4 GiB stays on AITER."""
    check_agreement(c)
    rc, text, _ = cli(c.argv())
    got = runtime(c)
    row_bytes = 1152 if c.kv == "bf16" else 576
    if c.pool_rows * row_bytes <= 2 ** 32:
        assert got[1].path.startswith("aiter") and got[1].spec.kv_cache_bytes == c.pool_rows * row_bytes
        return
    reason = f"kv_cache_bytes={c.pool_rows * row_bytes}, needs <= 4294967296 (AITER's MLA decode kernels address"
    assert reason in text, text
    if c.path is not None:  # forced onto an AITER path: refused by both, with the reason
        assert rc == 2 and got[0] == "refused" and reason in got[1].explanation
        return
    _, plan, launched, _, _ = got
    assert plan.spec.kv_cache_bytes == c.pool_rows * row_bytes
    assert plan.path == ("triton" if c.triton is None else "reference")
    assert launched is None or not any(isinstance(x, AiterCall) for x in launched)


def test_a_layer_is_planned_for_the_cache_each_call_gives():
    """The layer's construction-time plan assumes packed rows unless built with ``kv_rows_packed=False``; a call on a
    cache of strided rows is planned on Triton either way (the tensors decide), one on packed rows on AITER."""
    from mla_sink.layer import SparseMLADecode

    platform = Platform("gfx942", aiter_version="0.1.20", num_sms=304)
    packed = Call("gfx942", "0.1.20", None, "bf16", "bf16", 16, 4, 37, False, 1, True, 0.0, None, 304)
    for built_packed in (True, False):
        rec = Recorder("gfx942", 1)
        with rec.active():
            layer = SparseMLADecode(num_heads=16, q_dtype="bf16", kv_dtype="bf16", topk=37, return_lse=True,
                                    kv_rows_packed=built_packed, platform=platform)
            assert layer.plan.path == ("aiter_lse" if built_packed else "triton"), layer.plan
            for c in (packed, attrs.evolve(packed, packed=False)):
                x = tensors(c)
                layer(x.q, x.kv_cache, x.indices)
                assert rec.plans[-1].path == ("aiter_lse" if c.packed else "triton")
                assert rec.plans[-1].spec == attrs.evolve(layer.spec, kv_rows_packed=c.packed,
                                                          kv_cache_bytes=span_bytes(x.kv_cache))


def test_a_layer_built_for_a_pool_past_4_gib_plans_it_off_aiter():
    """A layer told its pool's size (``kv_cache_bytes``) plans as a call on that pool: off AITER past 2^32 bytes, on
    it within; the calls themselves are planned for the pool they give (the tensors decide, as for packed rows)."""
    from mla_sink.layer import SparseMLADecode

    platform = Platform("gfx942", aiter_version="0.1.20", num_sms=304)
    for size, path in ((2 ** 32, "aiter_lse"), (2 ** 32 + 1, "triton")):
        layer = SparseMLADecode(num_heads=16, q_dtype="bf16", kv_dtype="bf16", topk=37, return_lse=True,
                                kv_cache_bytes=size, platform=platform)
        assert layer.plan.path == path and layer.spec.kv_cache_bytes == size
    with pytest.raises(ValueError, match=r"'kv_cache_bytes' must be an int in \[0, 2\^63 - 1\] \(got -1\)"):
        SparseMLADecode(num_heads=16, q_dtype="bf16", kv_dtype="bf16", topk=37, kv_cache_bytes=-1, platform=platform)


def test_a_seesaw_call_of_a_topk_without_whole_16_id_rows_is_planned_on_the_kernel_that_runs():
    """The reproducer of the forty-first session's finding: ``explain --arch sm90 --heads 128 --topk 1000`` named
    gluon_seesaw while the launcher, given contiguous indices (row stride 1000, not a multiple of 16), ran the
    portable kernel. The plan names the portable kernel: the seesaw rows fail their path's requirement
    ``topk: {multiple_of: 16}`` (tables/triton_tuning.yaml), which explain states among the rejected rows."""
    c = Call("sm90", None, None, "bf16", "bf16", 128, 4, 1000, False, 1, False, 0.0, None, 132)
    _, plan, launched, _, _ = runtime(c)
    assert plan.launch.kernel == "portable" and launched == ["portable"] and plan.launch.fallback is None
    (seesaw,) = [why for label, why in plan.launch.rejected_kernels if "sm90_bf16_gluon_seesaw" in label]
    assert seesaw.startswith("topk=1000, needs a multiple of 16")
    rc, text, _ = cli(c.argv())
    assert rc == 0 and "kernel portable" in text and "kernel gluon_seesaw" not in text
    assert re.search(r"✗ gluon_seesaw \(rows [a-z0-9_, ]*sm90_bf16_gluon_seesaw[a-z0-9_, ]*\): topk=1000, needs a "
                     r"multiple of 16 \(", text), text
    _, plan, launched, _, _ = runtime(attrs.evolve(c, topk=1024))
    assert plan.launch.kernel == "gluon_seesaw" == launched[0] and plan.launch.fallback is None


@pytest.mark.parametrize("multiple,topk,kernel", [(8, 1000, "gluon_seesaw"), (32, 2000, "portable"),
                                                  (16, 2000, "gluon_seesaw"), (16, 1000, "portable")])
def test_an_edited_seesaw_topk_multiple_moves_explain_and_the_launcher_together(edited_tuning_table, multiple, topk,
                                                                                kernel):
    """The seesaw's topk multiple is read from the table by the plan (explain) and by the launcher (its stride check
    on the call's tensors) alike: with an edited copy of the table both move, and still agree - at 8, contiguous
    indices of row stride 1000 run the seesaw; at 32, those of stride 2000 do not."""
    edited_tuning_table('      topk: {multiple_of: 16, because:', f'      topk: {{multiple_of: {multiple}, because:')
    c = Call("sm90", None, None, "bf16", "bf16", 128, 4, topk, True, 1, False, 0.0, None, 132)
    check_agreement(c)
    _, plan, launched, _, _ = runtime(c)
    assert plan.launch.kernel == kernel and launched == [kernel], (plan.launch, launched)


# ---- strides the Gluon kernels cannot gather with: the plan names the kernel that runs ---------------------------

@pytest.mark.parametrize("c,fact", [
    # the break test's reproducer: q = buf[..., :576] of a [T, H, 580] buffer (head stride 580)
    (Call("sm90", None, None, "bf16", "bf16", 128, 4, 1024, False, 1, False, 0.0, None, 132, strides="q"),
     "gather_aligned"),
    # a kv_cache of row stride 580 (640 is a multiple of 16: the seesaw takes it, below)
    (Call("sm90", None, None, "bf16", "bf16", 64, 64, 2048, True, 1, False, 0.0, None, 132, strides="kv"),
     "gather_aligned"),
    (Call("sm90", None, None, "bf16", "fp8_e4m3", 128, 2, 2048, True, 1, False, 0.0, None, 132, strides="kv"),
     "gather_aligned"),
    # indices of row stride 1028 at topk 1024 (a topk the seesaw takes)
    (Call("sm90", None, None, "fp16", "fp16", 32, 8, 1024, False, 1, True, 0.0, None, 132, strides="idx"),
     "gather_aligned"),
    (Call("sm90", None, None, "bf16", "fp8_ds_mla", 128, 3, 2048, True, 1, False, 0.0, None, 132, strides="idx"),
     "gather_aligned"),
    (Call("sm90", None, None, "bf16", "bf16", 8, 2, 1024, True, 1, False, 0.0, None, 132, strides="q"),
     "gather_aligned"),
    # ids whose rows are not unit-stride: neither Gluon kernel reads them
    (Call("sm90", None, None, "bf16", "bf16", 128, 4, 1024, False, 1, False, 0.0, None, 132, strides="idx_step"),
     "unit_rows"),
    (Call("sm90", None, None, "bf16", "fp8_e4m3", 16, 4, 1024, False, 1, False, 0.0, None, 132, strides="idx_step"),
     "unit_rows"),
    (Call("sm90", None, None, "bf16", "fp8_ds_mla", 32, 4, 1024, True, 1, False, 0.0, None, 132, strides="idx_step"),
     "unit_rows"),
])
def test_a_call_whose_strides_a_gluon_kernel_cannot_gather_is_planned_on_the_portable_kernel(c, fact):
    """The forty-second session's break test: on sm90 the launcher ran the portable kernel for a call whose q / kv_cache
    / indices strides are not multiples of 16 elements, or whose rows are not unit-stride, while the plan and
    ``explain`` named the Gluon kernel. Those are facts of the call signature (``CallSpec.gather_aligned``,
    ``unit_rows``, read from the tensors), requirements of the Gluon paths in tables/triton_tuning.yaml: the plan
    names ``portable``, explain (``--no-gather-aligned`` / ``--no-unit-rows``) lists the Gluon rows as rejected with
    the table's reason, and the launcher runs what the plan says. The same call on aligned tensors plans Gluon."""
    check_agreement(c)
    _, plan, launched, _, _ = runtime(c)
    assert getattr(plan.spec, fact) is False and plan.launch.kernel == "portable" and launched == ["portable"]
    assert plan.launch.fallback is None and plan.launch.per_call is None
    rc, text, _ = cli(c.argv())
    assert rc == 0 and "kernel portable" in text and text.splitlines()[0] == call_key(plan.spec, plan.platform)
    assert text.splitlines()[0].endswith("-unaligned" if fact == "gather_aligned" else "-rowstrided")
    assert re.search(rf"✗ gluon_seesaw \(rows [a-z0-9_, ]+\): [^\n]*{fact}=false, needs true \(", text), text
    if fact == "unit_rows" and c.kv != "bf16":  # gluon_fp8 requires unit rows too
        assert re.search(r"✗ gluon_fp8 \(rows [a-z0-9_, ]+\): unit_rows=false, needs true \(", text), text
    doc = json.loads(cli(c.argv() + ["--json"])[1])
    assert doc["spec"][fact] is False and doc["launch"]["kernel"] == "portable"
    aligned = runtime(attrs.evolve(c, strides=None))
    assert aligned[1].launch.kernel.startswith("gluon_") and set(aligned[2]) == {aligned[1].launch.kernel}, aligned[1:3]


@pytest.mark.parametrize("c,kernel", [
    # gluon_fp8 gathers at any stride (a pool whose rows are not 16-byte aligned takes its gl.load twin): it does not
    # require gather_aligned, and runs for such a call as today
    (Call("sm90", None, None, "bf16", "fp8_e4m3", 16, 4, 1024, False, 1, False, 0.0, None, 132, strides="kv"),
     "gluon_fp8"),
    (Call("sm90", None, None, "bf16", "fp8_ds_mla", 32, 8, 1000, True, 1, False, 0.0, None, 132, strides="q"),
     "gluon_fp8"),
    (Call("sm90", None, None, "bf16", "fp8_e4m3", 24, 2, 2048, True, 1, False, 0.0, None, 132, strides="idx"),
     "gluon_fp8"),
    # a cache of rows of 640 (strides multiples of 16): the seesaw takes it
    (Call("sm90", None, None, "bf16", "bf16", 128, 4, 1024, False, 1, False, 0.0, None, 132, packed=False),
     "gluon_seesaw"),
])
def test_strides_a_gluon_kernel_takes_still_plan_it(c, kernel):
    check_agreement(c)
    _, plan, launched, _, _ = runtime(c)
    assert plan.launch.kernel == kernel and launched and set(launched) == {kernel}, (plan.launch, launched)


def test_explain_states_the_seesaws_per_call_pointer_condition():
    """Pointer alignment is per call (no plan sees it): a seesaw plan says, in text and JSON, that a call whose data
    pointers are not 16-byte aligned runs the portable kernel, and the runner does so (its prepared portable
    runner), while an aligned call of the same signature runs the seesaw."""
    c = Call("sm90", None, None, "bf16", "bf16", 128, 4, 1024, False, 1, False, 0.0, None, 132)
    rc, text, _ = cli(c.argv())
    doc = json.loads(cli(c.argv() + ["--json"])[1])
    said = doc["launch"]["per_call"]
    assert rc == 0 and said and "not all 16-byte aligned" in said and "runs the portable kernel" in said
    assert f"    per call: gluon_seesaw {said}" in text.splitlines()
    fp8 = json.loads(cli(attrs.evolve(c, kv="fp8_e4m3", heads=16).argv() + ["--json"])[1])["launch"]
    assert fp8["kernel"] == "gluon_fp8" and fp8["per_call"] is None  # gluon_fp8 takes any pointer


@pytest.mark.parametrize("multiple,kernel", [(4, "gluon_seesaw"), (8, "portable"), (16, "portable"),
                                             (32, "portable")])
def test_the_stride_multiple_is_the_tables(edited_tuning_table, multiple, kernel):
    """The multiple the gather strides are tested against is the tuning table's (the seesaw's topk multiple): with an
    edited copy of the table, q = buf[..., :576] of a [T, H, 580] buffer (head stride 580 = 4 x 145) is gather-aligned
    at 4, not at 8; explain and the launcher move together."""
    topk = 1024 if multiple <= 16 else 2048
    edited_tuning_table('      topk: {multiple_of: 16, because:', f'      topk: {{multiple_of: {multiple}, because:')
    c = Call("sm90", None, None, "bf16", "bf16", 128, 4, topk, False, 1, False, 0.0, None, 132, strides="q")
    _, plan, launched, _, _ = runtime(c)
    assert plan.spec.gather_aligned is (multiple == 4) and plan.launch.kernel == kernel == launched[0]
    if multiple == 4:  # explain of an aligned call (the default flags) says the same as the runtime
        check_agreement(attrs.evolve(c, strides=None))
    else:
        check_agreement(c)


@pytest.mark.parametrize("old,new,path,field", [
    ("      gather_aligned: {eq: true, because:", "      gather_aligned: {eq: false, because:", "gluon_seesaw",
     "gather_aligned"),
    ("      unit_rows: {eq: true, because: \"the seesaw", "      num_tokens: {ge: 1, because: \"the seesaw", "gluon_seesaw",
     "unit_rows"),
    ("      unit_rows: {eq: true, because: \"gluon_fp8", "      num_tokens: {ge: 1, because: \"gluon_fp8", "gluon_fp8",
     "unit_rows"),
])
def test_a_table_without_the_stride_requirements_its_launchers_rely_on_is_refused(edited_tuning_table, old, new, path,
                                                                                  field):
    """The launchers take a Gluon plan as the promise that the tensors have the stride facts; a tuning table whose
    Gluon path drops the requirement is refused when it loads, naming the path and the field."""
    from mla_sink import dispatch
    from mla_sink.paths.triton.plan import tuning_table

    edited_tuning_table(old, new)
    with pytest.raises(dispatch.TableError, match=rf"path '{path}' must require {field}: {{eq: true}}"):
        tuning_table()


def test_a_gluon_plan_handed_tensors_without_its_stride_facts_is_refused_not_run_silently():
    """The launcher agrees with the plan: a seesaw plan (made for aligned tensors) given a padded q is refused when
    its runner is prepared, naming the fact, instead of running the portable kernel while the plan names the seesaw."""
    from mla_sink.core.plan import build_plan
    from mla_sink.paths.triton.launch import PlanMismatchError, prepare_triton

    c = Call("sm90", None, None, "bf16", "bf16", 128, 4, 1024, False, 1, False, 0.0, None, 132, strides="q")
    plan = build_plan(CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=128, topk=1024), c.platform(), num_tokens=4,
                      path="triton")
    assert plan.launch.kernel == "gluon_seesaw"
    with pytest.raises(PlanMismatchError, match="gather_aligned=false"):
        prepare_triton(plan, tensors(c))


# ---- the platform explain plans for, where the flags leave it to this machine -------------------------------------

def _machine(monkeypatch, gpu: Optional[Platform], cpu: Platform) -> None:
    """This machine: ``gpu`` its default device (None: no GPU), ``cpu`` what the library detects for CPU tensors."""
    from mla_sink.core import platform as platform_mod

    def detect(device=None, *, tensor=None):
        if device is None:
            return gpu if gpu is not None else cpu
        return cpu if torch.device(device).type == "cpu" else gpu

    monkeypatch.setattr(platform_mod, "detect_platform", detect)


def test_explain_arch_cpu_on_a_gpu_machine_is_the_cpu_the_library_detects(monkeypatch):
    """On a GPU machine ``explain --arch cpu`` took the GPU's Triton flag and no SM count: on the H200 image (Triton
    3.6 with numpy 2.5, whose CPU interpreter cannot run the kernel, so CPU calls take the reference) it named the
    triton path, and everywhere it left the CPU's split count open ("pass --sms N", which ``cpu`` refuses)."""
    cpu = Platform("cpu", triton=False, gluon=False, num_sms=1)
    _machine(monkeypatch, Platform("sm90", triton=True, gluon=True, num_sms=132), cpu)
    rc, out, _ = cli(["explain", "--arch", "cpu", "--tokens", "4", "--json"])
    doc = json.loads(out)
    assert rc == 0 and doc["platform"] == attrs.asdict(cpu) and doc["path"] == "reference"
    cpu = attrs.evolve(cpu, triton=True)
    _machine(monkeypatch, Platform("sm90", triton=True, gluon=True, num_sms=132), cpu)
    for flags in ([], ["--triton"]):
        rc, out, _ = cli(["explain", "--arch", "cpu", "--tokens", "4", "--json", *flags])
        doc = json.loads(out)
        assert rc == 0 and doc["platform"] == attrs.asdict(cpu), flags  # one SM, no Gluon
        assert doc["launch"]["kernel"] == "portable" and doc["launch"]["num_kv_splits"] == 1
    rc, out, _ = cli(["explain", "--arch", "cpu", "--tokens", "4"])
    assert "kernel not decided" not in out and "kernel portable" in out


def test_explain_of_a_gpu_arch_takes_tritons_import_not_the_cpu_interpreters_check(monkeypatch):
    """On a CPU machine whose Triton interpreter cannot run the kernel (``Platform.detect('cpu').triton`` False),
    ``explain --arch sm90`` said "Triton is not importable" and named the reference: an sm90 machine with this
    Triton runs the seesaw."""
    _machine(monkeypatch, None, Platform("cpu", triton=False, gluon=False, num_sms=1))
    rc, out, _ = cli(["explain", "--arch", "sm90", "--heads", "128", "--tokens", "256", "--sms", "132", "--json"])
    doc = json.loads(out)
    assert rc == 0 and doc["platform"]["triton"] is _triton_available()
    if _triton_available():
        assert doc["path"] == "triton" and doc["launch"]["kernel"] == "gluon_seesaw"
    # this machine's own arch keeps what the library detects for it
    rc, out, _ = cli(["explain", "--tokens", "4", "--json"])
    assert json.loads(out)["platform"] == attrs.asdict(Platform("cpu", triton=False, gluon=False, num_sms=1))


# ---- malformed calls: refused by both, naming the argument --------------------------------------------------------

def _call_with(**kw):
    """A function call on CPU tensors (T=2, H=4, topk=16, bf16) with the changes ``kw``."""
    t, h, topk = kw.pop("T", 2), kw.pop("H", 4), kw.pop("topk", 16)
    q_dtype, kv_dtype = kw.pop("q", "bf16"), kw.pop("kv", "bf16")
    q = torch.zeros(t, h, 576, dtype=TORCH_DTYPES[q_dtype])
    kv = torch.zeros(8, 656 if kv_dtype == "fp8_ds_mla" else 576, dtype=TORCH_DTYPES[kv_dtype])
    idx = kw.pop("indices", None)
    idx = torch.zeros(t, topk, dtype=torch.int32) if idx is None else idx
    scales = dict(q_scale=torch.ones(1) if q_dtype in FP8_KEYS else None,
                  kv_scale=torch.ones(1) if kv_dtype in FP8_KEYS else None)
    return lambda: api.sparse_mla_decode(q, kv, idx, **scales, **kw)


@pytest.mark.parametrize("flags,call,named,flag", [
    (["--heads", "0"], _call_with(H=0), "'q'", "--heads"),
    (["--topk", "0"], _call_with(topk=0), "'indices'", "--topk"),
    (["--topk", str(2 ** 30 + 1)], _call_with(indices=torch.zeros(1, 1, dtype=torch.int32).expand(2, 2 ** 30 + 1)),
     "'indices'", "--topk"),
    (["--logit-cap", "1e-40"], _call_with(logit_cap=1e-40), "'logit_cap'", "--logit-cap"),
    (["--logit-cap", "inf"], _call_with(logit_cap=float("inf")), "'logit_cap'", "--logit-cap"),
    (["--logit-cap", "nan"], _call_with(logit_cap=float("nan")), "'logit_cap'", "--logit-cap"),
    (["--q-dtype", "fp8_e4m3", "--kv-dtype", "bf16"], _call_with(q="fp8_e4m3", kv="bf16"), "(q dtype, kv_cache dtype)",
     "--q-dtype/--kv-dtype"),
    (["--q-dtype", "fp8_e4m3", "--kv-dtype", "fp8_ds_mla"], _call_with(q="fp8_e4m3", kv="fp8_ds_mla"),
     "(q dtype, kv_cache dtype)", "--q-dtype/--kv-dtype"),
    (["--q-dtype", "fp8_e4m3", "--kv-dtype", "fp8_e4m3fnuz"], _call_with(q="fp8_e4m3", kv="fp8_e4m3fnuz"),
     "(q dtype, kv_cache dtype)", "--q-dtype/--kv-dtype"),
    (["--path", "gluon"], _call_with(path="gluon"), "'path'", "--path"),
])
def test_a_call_explain_refuses_as_malformed_the_library_refuses_naming_the_argument(flags, call, named, flag):
    rc, out, err = cli(["explain", "--arch", "cpu", *flags])
    assert rc == 2 and not out and err.startswith((f"error: {flag}: ", f"error: '{flag}' ")), err
    with pytest.raises(ValueError, match=re.escape(named)):
        call()


def test_dcp_world_size_zero_is_refused_by_both_naming_it():
    rc, out, err = cli(["explain", "--arch", "cpu", "--dcp", "0"])
    assert rc == 2 and "'--dcp' must be in [1," in err
    with pytest.raises(ValueError, match="'dcp_world_size' must be an int >= 1"):
        CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=4, topk=16, dcp_world_size=0)


# ---- --matrix ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dcp", [1, 2])
def test_every_matrix_cell_is_what_explain_says_of_that_call(dcp):
    rc, js, _ = cli(["explain", "--matrix", "--json", "--dcp", str(dcp)])
    rc_text, text, _ = cli(["explain", "--matrix", "--dcp", str(dcp)])
    assert rc == rc_text == 0
    doc = json.loads(js)
    assert list(doc) == [str(p) for p in matrix_platforms()]
    cols = [f"h{h}" + ("+s" if s else "") for h in MATRIX_HEADS for s in (False, True)]
    grid = {}
    for line in text.splitlines()[3:]:
        if line.strip() and not line.startswith("legend"):
            platform, dtypes, *cells = line.split()
            grid[platform, dtypes] = cells
    assert len(grid) == len(doc) * len(MATRIX_DTYPES)
    for platform in matrix_platforms():
        for q, kv in MATRIX_DTYPES:
            row = doc[str(platform)][f"{q}/{kv}"]
            assert list(row) == cols
            assert grid[str(platform), f"{q}/{kv}"] == ["✗" if row[c] == "refused" else _ABBREV[row[c]] for c in cols]
            for h in MATRIX_HEADS:
                for sinks in (False, True):
                    argv = ["explain", "--arch", platform.arch, "--aiter", platform.aiter_version or "none",
                            "--triton" if platform.triton else "--no-triton", "--q-dtype", q, "--kv-dtype", kv,
                            "--heads", str(h), "--topk", "2048", "--dcp", str(dcp), "--json",
                            "--aiter-experimental" if platform.aiter_experimental else "--no-aiter-experimental"
                            ] + ["--sinks"] * sinks
                    rc, one, _ = cli(argv)
                    said = json.loads(one)
                    cell = row[f"h{h}" + ("+s" if sinks else "")]
                    assert cell == ("refused" if said["refused"] else said["path"]), (platform, q, kv, h, sinks)
                    assert rc == (2 if cell == "refused" else 0)


# ---- the demo ----------------------------------------------------------------------------------------------------

@pytest.mark.interpreter
@pytest.mark.parametrize("extra", [[], ["--no-sinks"], ["--kv-dtype", "fp8_e4m3"], ["--kv-dtype", "fp8_ds_mla"],
                                   ["--path", "reference"], ["--path", "triton", "--dtype", "fp16"]])
def test_the_demo_explains_the_call_it_makes(extra):
    """The demo prints its call's key, path, row and launch: those of the plan its call runs under, as ``explain``
    prints them for that call; its count of rejected rows is explain's."""
    import mla_sink.paths as paths

    argv = ["demo", "--device", "cpu", "--tokens", "3", "--heads", "5", "--topk", "40", "--pool-rows", "64", *extra]
    plans = []
    real = paths.prepare_runner
    with mock.patch.object(paths, "prepare_runner", lambda plan, x: plans.append(plan) or real(plan, x)):
        api.forget_prepared_calls()
        rc, out, err = cli(argv)
    assert rc == 0, err
    plan = plans[0]
    assert all((p.path, p.row_id, p.launch) == (plan.path, plan.row_id, plan.launch) for p in plans)
    lines = out.splitlines()
    assert lines[0].startswith(f"call: {call_key(plan.spec, plan.platform)} on {plan.platform}; T=3 topk=40 ")
    assert lines[-1].startswith("time: ") and f"path {plan.path}" in lines[-1]
    if plan.row_id == "forced":
        assert lines[1] == "  → reference   (forced: the float64 reference runs anywhere)"
        return
    flags = ["--arch", "cpu", "--heads", "5", "--topk", "40", "--tokens", "3", "--return-lse",
             "--q-dtype", plan.spec.q_dtype, "--kv-dtype", plan.spec.kv_dtype] + ["--sinks"] * plan.spec.sinks
    flags += ["--path", extra[extra.index("--path") + 1]] if "--path" in extra else []
    rc, text, _ = cli(["explain", *flags])
    said = text.splitlines()
    assert rc == 0 and said[0] == call_key(plan.spec, plan.platform)
    explained = [x for x in said[1:] if not x.startswith("  ✗ ")]  # explain's lines but the rejected rows
    assert lines[1:1 + len(explained)] == explained  # the winner, its why and source, and the launch
    assert f"kernel {plan.launch.kernel} (" in out
    doc = json.loads(cli(["explain", *flags, "--json"])[1])
    rows = len(doc["rejected"]) + sum(len(p["rows"]) for p in doc["rejected_paths"])
    assert f"  ({rows} earlier rows rejected;" in out
