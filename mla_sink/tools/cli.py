"""``mla-sink`` command line: ``explain``, ``demo``, ``info``, ``tables`` and ``bench`` (``mla-sink --version``).

``mla-sink explain`` prints which kernel path a call takes on a platform and why (every platform
field is a flag, defaulting to this machine); ``--json`` for machines, ``--matrix`` for a grid.
A refused call exits with status 2 and prints the explanation.
"""

from __future__ import annotations

import argparse
import fractions
import json
import os
import sys
from types import MappingProxyType
from typing import Any, Mapping, Optional, Sequence

import attrs

from mla_sink.core.dtypes import DTYPE_KEYS, KV_DTYPE_KEYS, allowed_dtype_pairs
from mla_sink.core.records import BYTES_MAX, COUNT_MAX, TOPK_MAX, CallSpec, Platform, call_key, canonical_arch
from mla_sink.tools.flags import CLI_UNSET_PATH, check_count, check_not_empty, flag_named

_DTYPES = sorted(DTYPE_KEYS.values())  # q (and 576-column KV) dtypes
_KV_DTYPES = list(KV_DTYPE_KEYS)  # ... and the 656-byte V3.2 rows, fp8_ds_mla
_ABBREV = {
    "aiter_persistent": "P",
    "aiter_lse": "L",
    "aiter_lse_single_split": "L1",
    "aiter_lse_fp8_two_split": "L2",
    "triton": "T",
    "reference": "R",
}


#: ``mla-sink --help``'s description (plain text: the module docstring's markup would show as is).
DESCRIPTION = ("mla-sink: the decode step of sparse Multi-head Latent Attention with attention sinks. The commands "
               "explain a call's kernel path, run a demo, show this machine's platform, check the rule tables and "
               "time the kernels.")


def _platform_from_args(args: argparse.Namespace) -> Platform:
    """The :class:`Platform` ``explain`` plans for: the flags given, the rest as the library detects the device of
    that arch on this machine, where it has one (:func:`_local_platform`): its GPU for its own arch, the CPU for
    ``cpu``. For any other arch: no AITER, Triton as importable here, Gluon as Triton, the SM count unknown."""
    from mla_sink.core.platform import _triton_available, detect_platform

    for flag, value in (("--arch", args.arch), ("--aiter", args.aiter)):
        check_not_empty(flag, value, "this machine's")  # not silently "this machine" / "none"
    here = detect_platform()
    arch = canonical_arch(args.arch) if args.arch else here.arch  # sm90a is this machine's sm90 too
    local = _local_platform(arch, here)
    if args.aiter is None:
        aiter = local.aiter_version if local is not None else None
    else:
        aiter = None if args.aiter.lower() in ("none", "no", "absent") else args.aiter
    if args.triton is not None:
        triton = args.triton
    else:  # another GPU's Triton is this machine's importable one, not whether its CPU interpreter works
        triton = local.triton if local is not None else _triton_available()
    if local is not None and (args.triton is None or arch == _cpu_arch()):
        gluon = local.gluon and triton  # the CPU never has Gluon (Platform.detect('cpu'))
    else:
        gluon = None  # as triton
    sms = args.sms if getattr(args, "sms", None) is not None else (local.num_sms if local is not None else None)
    experimental = getattr(args, "aiter_experimental", None)
    if experimental is None:
        experimental = local.aiter_experimental if local is not None else False
    return Platform(arch=arch, aiter_version=aiter, triton=triton, gluon=gluon, num_sms=sms,
                    aiter_experimental=experimental)


def _cpu_arch() -> str:
    """The arch name of the CPU (``Platform.arch`` of CPU tensors)."""
    from mla_sink.core.platform import arch_of

    return arch_of("cpu")


def _local_platform(arch: str, here: Platform) -> Optional[Platform]:
    """The platform the library detects for a device of ``arch`` on this machine (the one a call on such tensors
    plans for): ``here`` (this machine's default device) for its own arch, the CPU's for ``cpu`` (Triton's
    interpreter, if it works with this numpy; one SM; no Gluon, no AITER) even on a GPU machine; ``None`` for an
    arch this machine has no device of. (Before, ``--arch cpu`` on a GPU machine took the GPU's Triton flag and no
    SM count: it named the Triton path where CPU calls run the reference, and left the split count open - a break
    test, forty-first session.)"""
    from mla_sink.core.platform import detect_platform

    if arch == _cpu_arch():
        return detect_platform("cpu")
    return here if arch == here.arch else None


def _spec_from_args(args: argparse.Namespace) -> CallSpec:
    for flag, value, high in (("--heads", args.heads, COUNT_MAX), ("--topk", args.topk, TOPK_MAX),
                              ("--dcp", args.dcp, COUNT_MAX)):
        check_count(flag, value, high=high)  # named by the flag, as --tokens and --sms are; CallSpec checks the rest
    check_count("--kv-cache-bytes", args.kv_cache_bytes, low=0, high=BYTES_MAX)
    return CallSpec(q_dtype=args.q_dtype, kv_dtype=args.kv_dtype or args.q_dtype, num_heads=args.heads,
                    topk=args.topk, sinks=args.sinks, dcp_world_size=args.dcp,
                    need_lse=args.return_lse, logit_cap=args.logit_cap, kv_rows_packed=args.kv_rows_packed,
                    gather_aligned=args.gather_aligned, unit_rows=args.unit_rows, kv_cache_bytes=args.kv_cache_bytes)


def _real_flag(text: str) -> Any:
    """A real flag's value: ``float(text)``, except for a nonzero value below fp64's range (``1e-400``), whose float
    is ``0.0``: its exact Fraction, so that the field's own check refuses it as too small instead of reading 0 (no
    cap for ``--logit-cap``; a break test, sixty-third session). argparse's error for what is not a number."""
    value = float(text)
    if value == 0.0:
        try:
            exact = fractions.Fraction(text.strip())
        except (ValueError, ZeroDivisionError):
            return value
        if exact != 0:
            return exact
    return value


_real_flag.__name__ = "float"  # argparse names the type in its refusal: "invalid float value: ''", as type=float did


def _add_call_flags(p: argparse.ArgumentParser) -> None:
    """The flags that describe one call; their destinations and defaults are recorded as ``call_flags``."""
    flags: dict = {}  # dest -> (flag names, default)

    def add(where, *names, **kwargs) -> None:  # add_argument, recording the Action it returns
        action = where.add_argument(*names, **kwargs)
        # --triton and --no-triton share one destination: the first one's default holds; a BooleanOptionalAction
        # is both spellings at once (--kv-rows-packed/--no-kv-rows-packed)
        seen, default = flags.get(action.dest, ((), action.default))
        both = isinstance(action, argparse.BooleanOptionalAction)
        flags[action.dest] = (seen + (tuple(action.option_strings) if both else (action.option_strings[0],)), default)

    add(p, "--arch", help="compile target, e.g. gfx942, gfx950, gfx90a, sm80, sm89, sm90, sm100, cpu (default: this "
                          "machine); an NVIDIA feature suffix names the plain target (sm90a is sm90), a ROCm target "
                          "id its processor (gfx942:sramecc+:xnack- is gfx942)")
    add(p, "--aiter", metavar="VERSION",
        help="installed AITER version, e.g. 0.1.20, or 'none' for no AITER (default: this machine's when --arch is "
             "this machine's, else none)")
    add(p, "--aiter-experimental", dest="aiter_experimental", action=argparse.BooleanOptionalAction, default=None,
        help="AITER's experimental kernels are on (AITER_ENABLE_EXPERIMENTAL set to an int other than 0), which "
             "keeps fp8 persistent calls off AITER (default: this machine's when --arch is this machine's, else off)")
    tri = p.add_mutually_exclusive_group()
    add(tri, "--triton", dest="triton", action="store_true", default=None,
        help="Triton can run the kernel on the platform (default: as on this machine)")
    add(tri, "--no-triton", dest="triton", action="store_false",
        help="Triton cannot run there: no Triton or Gluon kernel (default: as on this machine)")
    add(p, "--q-dtype", default="bf16", choices=_DTYPES, help="dtype key of q (default %(default)s)")
    add(p, "--kv-dtype", default=None, choices=_KV_DTYPES,
        help="dtype key of kv_cache (default: the q dtype); fp8_ds_mla = the 656-byte V3.2 FP8 rows (bf16/fp16 q)")
    add(p, "--heads", type=int, default=16, help="num_heads H, query heads (default %(default)s)")
    add(p, "--topk", type=int, default=2048, help="topk, ids per token in indices [T, topk] (default %(default)s)")
    add(p, "--sinks", action="store_true", help="the call has per-head sinks [H] (default: no sinks)")
    add(p, "--dcp", type=int, default=1,
        help="dcp_world_size, decode-context-parallel ranks (default %(default)s: no DCP)")
    add(p, "--return-lse", action="store_true",
        help="the call asks for the LSE (default: only where sinks or DCP need one)")
    add(p, "--logit-cap", type=_real_flag, default=0.0,
        help="logit_cap: soft cap of the scaled scores, cap * tanh(s / cap); <= 0 = no cap (default %(default)s)")
    add(p, "--kv-rows-packed", dest="kv_rows_packed", action=argparse.BooleanOptionalAction, default=True,
        help="kv_rows_packed: kv_cache's rows follow each other without a gap, as in a contiguous [N, 576] (the "
             "default); --no-kv-rows-packed for a row stride other than the row's width, e.g. a [N, 576] view of "
             "rows of 640, as the library reads it from the call's kv_cache")
    add(p, "--gather-aligned", dest="gather_aligned", action=argparse.BooleanOptionalAction, default=True,
        help="gather_aligned: q's token and head strides and kv_cache's row stride (elements) are multiples of the "
             "tuning table's stride multiple and indices' row stride is one too or is topk, as for contiguous "
             "tensors (the default); --no-gather-aligned for e.g. q = buf[..., :576] of a [T, H, 580] buffer, a "
             "kv_cache of row stride 580 or indices of row stride 1028 at topk 1024, as the library reads it from "
             "the call's tensors (the seesaw requires it)")
    add(p, "--unit-rows", dest="unit_rows", action=argparse.BooleanOptionalAction, default=True,
        help="unit_rows: the rows of q, kv_cache and indices are unit-stride (the default); --no-unit-rows for e.g. "
             "indices = ids[:, ::2], as the library reads it from the call's tensors (both Gluon kernels require it)")
    add(p, "--kv-cache-bytes", dest="kv_cache_bytes", type=int, default=0,
        help="kv_cache_bytes: the bytes kv_cache spans, from its first byte to the end of its last row (N * 1152 for "
             "a contiguous bf16 [N, 576]), as the library reads it from the call's kv_cache; the AITER paths take "
             "pools of at most 2^32 bytes (default 0: a small pool)")
    add(p, "--path", default=None,
        help="consider only rows naming this path (a path of tables/mla_decode.yaml; 'reference' is always "
             "honoured; default: every row, the table's first match wins)")
    add(p, "--tokens", type=int, default=64, help="tokens T per call (Triton launch: tuning row, splits; AITER: the "
                                                  "call, in token chunks past 2^31 - 1 id slots; default 64)")
    add(p, "--sms", type=int, default=None,
        help="SM/CU count for the split decision (default: this machine's GPU when it is that arch)")
    p.set_defaults(call_flags={dest: ("/".join(names), default) for dest, (names, default) in flags.items()})


#: What a call flag reads when the command line does not give it (:func:`_given_call_flags`).
_UNSET = object()


def _add_explain_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``mla-sink explain``: the call flags, ``--json`` and ``--matrix``."""
    _add_call_flags(p)
    p.add_argument("--json", action="store_true", help="print the plan record as JSON (default: text)")
    p.add_argument("--matrix", action="store_true",
                   help="print the chosen path over archs x dtypes x heads x sinks instead of one call (of the call "
                        "flags only --dcp applies; default: one call)")


def _given_call_flags(args: argparse.Namespace) -> set:
    """The destinations of the call flags the command line gave (even at their default value): ``explain``'s
    arguments parsed again into a namespace that already holds every call flag's destination, which argparse
    leaves alone unless the flag is given."""
    p = _Parser(prog="mla-sink explain")
    _add_explain_arguments(p)
    given = p.parse_args(args.explain_argv, namespace=argparse.Namespace(**{d: _UNSET for d in args.call_flags}))
    return {d for d in args.call_flags if getattr(given, d) is not _UNSET}


def _check_matrix_flags(args: argparse.Namespace) -> None:
    """``--matrix`` covers every arch, dtype pair, head count and sinks: refuse a call flag given with it (other
    than ``--dcp``), even at its default value, instead of ignoring it.

    Raises:
        ValueError: naming the flag and its value.
    """
    given = _given_call_flags(args)
    for dest, (flag, _) in args.call_flags.items():
        value = getattr(args, dest)
        if dest != "dcp" and dest in given:
            raise ValueError(f"'{flag}' does not apply to --matrix, which covers every arch, dtype pair, head count "
                             f"and sinks (of the call flags only --dcp applies; got {flag} {value})")


def _cmd_explain(args: argparse.Namespace) -> int:
    from mla_sink import dispatch
    from mla_sink.core.plan import build_plan
    from mla_sink.core.select import NoKernelError, check_path, explain_call, select
    from mla_sink.tools.explain import launch_lines, plan_to_dict

    check_count("--tokens", args.tokens, low=0)  # T = 0 is a call (it launches nothing), as in the library
    check_path(args.path, unset=CLI_UNSET_PATH)
    if args.sms is not None:
        check_count("--sms", args.sms)

    if args.matrix:
        _check_matrix_flags(args)
        if args.json:
            print(json.dumps(matrix_dict(args), indent=2))
        else:
            print(matrix_text(args))
        return 0
    platform = _platform_from_args(args)
    spec = _spec_from_args(args)
    key = call_key(spec, platform)
    if args.path == "reference":  # always honoured (see mla_sink.core.select.plan_call)
        if args.json:  # the plan's document, as for every other path (row "forced": no row consulted)
            plan = build_plan(spec, platform, num_tokens=args.tokens, path="reference")
            print(json.dumps(plan_to_dict(plan), indent=2))
        else:
            print(explain_call(spec, platform, path="reference"))
        return 0
    sel = select(spec, platform, path=args.path)
    try:
        plan = build_plan(spec, platform, num_tokens=args.tokens, path=args.path)
    except NoKernelError as e:
        plan, refusal = None, e
    if args.json:
        if plan is None:
            doc = dispatch.selection_to_dict(sel)  # a plan's keys, launch None: nothing runs
            doc.update(key=key, spec=attrs.asdict(spec), platform=attrs.asdict(platform), need_lse=spec.need_lse,
                       num_tokens=args.tokens, launch=None)
        else:
            doc = plan_to_dict(plan, sel)
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(dispatch.explain(sel, key=key, details=launch_lines(plan) if plan is not None else ()))
    if plan is None:
        print(f"error: {_refusal_line(refusal, args.path)}", file=sys.stderr)
        return 2
    return 0


def matrix_platforms() -> tuple:
    """The platforms of ``explain --matrix``, from the rule table's field domains: every arch it declares,
    with the newest AITER version it declares where the AITER paths accept that arch; the first such arch
    also with AITER's experimental kernels on (``AITER_ENABLE_EXPERIMENTAL``: the rows that leave AITER under it),
    with the oldest version and with none; the CPU also without Triton."""
    from packaging.version import Version

    from mla_sink.core.select import mla_table, path_platform_failures

    table = mla_table()
    versions = sorted((v for v in table.fields["aiter_version"].domain if v is not None), key=Version)
    aiter_paths = [p for p in table.paths if p.startswith("aiter")]
    out, first_aiter = [], None
    for arch in table.fields["arch"].domain:
        newest = Platform(arch, versions[-1])
        if not all(path_platform_failures(p, newest) for p in aiter_paths):  # the AITER paths' requires
            out.append(newest)
            first_aiter = first_aiter or arch
        else:
            out.append(Platform(arch))
    if first_aiter is not None:
        out += [Platform(first_aiter, versions[-1], aiter_experimental=True), Platform(first_aiter, versions[0]),
                Platform(first_aiter, None)]
    out += [attrs.evolve(p, triton=False) for p in out if p.arch == "cpu"]
    return tuple(out)


MATRIX_DTYPES = (("bf16", "bf16"), ("fp16", "fp16"), ("fp8_e4m3fnuz", "fp8_e4m3fnuz"), ("fp8_e4m3", "fp8_e4m3"),
                 ("bf16", "fp8_e4m3"), ("bf16", "fp8_ds_mla"))
MATRIX_HEADS = (8, 16, 24, 32, 64, 128, 256)


def matrix_dict(args: Optional[argparse.Namespace] = None) -> dict:
    """The matrix as JSON: ``{platform key: {"q/kv": {"h16": path or "refused", "h16+s": ...}}}``."""
    from mla_sink.core.select import select

    dcp = getattr(args, "dcp", 1) if args is not None else 1
    doc: dict = {}
    for platform in matrix_platforms():
        for q, kv in MATRIX_DTYPES:
            row = doc.setdefault(str(platform), {}).setdefault(f"{q}/{kv}", {})
            for h in MATRIX_HEADS:
                for s in (False, True):
                    spec = CallSpec(q_dtype=q, kv_dtype=kv, num_heads=h, topk=2048, sinks=s, dcp_world_size=dcp)
                    sel = select(spec, platform)
                    row[f"h{h}" + ("+s" if s else "")] = "refused" if sel.refused or sel.path is None else sel.path
    return doc


def matrix_text(args: Optional[argparse.Namespace] = None) -> str:
    """A platforms x dtypes by heads x sinks grid of chosen paths (abbreviated, legend below it)."""
    dcp = getattr(args, "dcp", 1) if args is not None else 1
    doc = matrix_dict(args)
    cols = [f"h{h}" + ("+s" if s else "") for h in MATRIX_HEADS for s in (False, True)]
    # the label columns as wide as their longest entry plus a space, so every cell sits under its header
    w_plat = max(len("platform"), *(len(p) for p in doc)) + 1
    w_dt = max(len("q/kv"), *(len(d) for by in doc.values() for d in by)) + 1
    header = f"{'platform':<{w_plat}}{'q/kv':<{w_dt}}" + "".join(f"{c:>7}" for c in cols)
    lines = [f"chosen path (dcp={dcp}; +s = with sinks)", header, "-" * len(header)]
    for platform, by_dtype in doc.items():
        for dtypes, row in by_dtype.items():
            cells = ["✗" if row[c] == "refused" else _ABBREV[row[c]] for c in cols]
            lines.append(f"{platform:<{w_plat}}{dtypes:<{w_dt}}" + "".join(f"{c:>7}" for c in cells))
    legend = ", ".join(f"{v}={k}" for k, v in _ABBREV.items())
    lines += ["", f"legend: {legend}, ✗=refused (run `mla-sink explain ...` for the reason)"]
    return "\n".join(lines)


def _cmd_info(args: argparse.Namespace) -> int:
    import importlib.metadata

    import torch

    from mla_sink.tools.info import path_availability
    from mla_sink.core.platform import detect_platform

    platform = detect_platform()
    print(f"platform: {platform}  (arch={platform.arch}, aiter={platform.aiter_version}, "
          f"aiter_experimental={platform.aiter_experimental}, triton={platform.triton}, gluon={platform.gluon}, "
          f"num_sms={platform.num_sms})")
    for name in ("torch", "triton", "aiter", "amd-aiter"):
        try:
            print(f"  {name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            if name in ("torch", "triton"):
                print(f"  {name}: not installed")
    print(f"  torch.version.cuda={torch.version.cuda} torch.version.hip={torch.version.hip}")
    print("paths:")
    for path, ok, reason in path_availability(platform):
        print(f"  {'✓' if ok else '✗'} {path:<26} {reason}")
    _print_default_plan(platform)
    return 0


def table_readers() -> tuple:
    """``(name, loader)`` of every shipped rule table: the function its reader loads it with (schema, the checker's
    proof of no gap and no shadowed row, then the reader's own checks of its params; each caches its table)."""
    from mla_sink.core.dtypes import call_dtypes_table
    from mla_sink.core.platform import interpreter_table
    from mla_sink.core.select import mla_table
    from mla_sink.kernels.gluon.tuning import gluon_fp8_table, gluon_seesaw_table
    from mla_sink.paths.triton.plan import dcp_merge_table, tuning_table
    from mla_sink.tools.peers import peers_table

    return (("call_dtypes", call_dtypes_table), ("mla_decode", mla_table), ("triton_tuning", tuning_table),
            ("gluon_fp8", gluon_fp8_table),
            ("gluon_seesaw", gluon_seesaw_table), ("dcp_merge", dcp_merge_table), ("peers", peers_table),
            ("triton_interpreter", interpreter_table))


def _cmd_tables(args: argparse.Namespace) -> int:
    """``mla-sink tables``: each shipped table checked as its reader loads it, one line each; exit 2 if one fails
    (most tables load lazily, on the first call they route: an edited table is otherwise only found there)."""
    from mla_sink.core.tables import table_path
    from mla_sink.dispatch import TableCheckError, TableError, assert_table_ok

    readers = table_readers()
    failed = []
    for name, load in readers:
        try:
            table = load()
            # also at each threshold's neighbours, an unlisted value of each open str field and the versions beside
            # each version threshold, not only the declared values: a gap there passed and then failed the lookup of
            # a call (the loaders prove the declared grid only, to keep a process's first call fast; break tests,
            # forty-third and fifty-third sessions)
            assert_table_ok(table, thresholds=True)
        except (TableError, TableCheckError, FileNotFoundError) as e:
            failed.append(name)
            print(f"✗ {name}: {e}")
        else:
            print(f"✓ {name}: {len(table.rows)} rows, every combination of its fields gets one, none shadowed "
                  f"({table_path(name)})")
    if failed:
        print(f"error: {len(failed)} of {len(readers)} tables failed their checks: {', '.join(failed)}",
              file=sys.stderr)
        return 2
    return 0


def _print_default_plan(platform: Platform) -> None:
    """The plan record of the demo's default call on this platform (what ``mla-sink demo`` runs)."""
    from mla_sink.core.plan import build_plan
    from mla_sink.core.select import NoKernelError
    from mla_sink.tools.demo import add_demo_arguments, demo_dtypes
    from mla_sink.tools.explain import launch_lines

    demo = argparse.ArgumentParser()
    add_demo_arguments(demo)
    d = demo.parse_args([])
    q_dtype, kv_dtype = demo_dtypes(d)
    spec = CallSpec(q_dtype=q_dtype, kv_dtype=kv_dtype, num_heads=d.heads, topk=d.topk, sinks=not d.no_sinks)
    print(f"plan of the demo's call ({call_key(spec, platform)}, T={d.tokens}):")
    try:
        plan = build_plan(spec, platform, num_tokens=d.tokens)
    except NoKernelError as e:
        print("  refused: " + e.explanation.splitlines()[1].strip())
        return
    print(f"  → {plan.path}   (row {plan.row_id})")
    for line in launch_lines(plan):
        print(line)
    print("kv dtypes (the demo's call with each KV dtype q can pair with):")
    for kv in KV_DTYPE_KEYS:
        if kv == spec.kv_dtype:
            continue
        other = attrs.evolve(spec, kv_dtype=kv) if (spec.q_dtype, kv) in allowed_dtype_pairs() else None
        if other is None:
            continue
        try:
            p = build_plan(other, platform, num_tokens=d.tokens)
            launch = f", kernel {p.launch.kernel}" if p.launch is not None and hasattr(p.launch, "kernel") else ""
            print(f"  {kv:<14} → {p.path}   (row {p.row_id}{launch})")
        except NoKernelError as e:
            print(f"  {kv:<14} refused: " + e.explanation.splitlines()[1].strip())


def _cmd_demo(args: argparse.Namespace) -> int:
    from mla_sink.tools.demo import run_demo

    return run_demo(args)


def _version() -> str:
    """``mla_sink.__version__``: the version of the code that runs (pyproject.toml states the same)."""
    from mla_sink import __version__

    return __version__


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``mla-sink <command>: error: ...``, exit 2), no usage block."""

    #: the top-level parser's subcommand parsers by name (``build_parser`` sets it; none on a subcommand's)
    commands: Mapping[str, argparse.ArgumentParser] = MappingProxyType({})

    def error(self, message: str):  # noqa: D102 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def error_from_command(self, command: str, argv: list, extras: list):
        """Exit 2 naming ``extras`` (arguments no parser took) as unrecognized, by the parser of ``command`` when
        they all follow it on the command line (``mla-sink demo: error: ...``), else by this top-level parser."""
        after = _args_after(argv, command)
        owner = self.commands.get(command, self) if all(e in after for e in extras) else self
        owner.error(f"unrecognized arguments: {' '.join(extras)}")


def build_parser() -> argparse.ArgumentParser:
    """The ``mla-sink`` argument parser (subcommands explain, demo, info, tables and, when its imports work, bench)."""
    parser = _Parser(prog="mla-sink", description=DESCRIPTION,
                     epilog="Run 'mla-sink COMMAND --help' for a command's flags.")
    parser.add_argument("--version", action="version", version=f"mla-sink {_version()}",
                        help="print the version (mla_sink.__version__) and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("explain", help="which kernel path a call takes, and why",
                       description="Print the plan of one call on a platform (every platform field is a flag, "
                                   "defaulting to this machine): the rule table's path and row, the launch for "
                                   "--tokens tokens, and every rejected row with its reason. A refused call exits "
                                   "with status 2.")
    _add_explain_arguments(p)
    p.set_defaults(func=_cmd_explain)

    p = sub.add_parser("demo", help="run sparse MLA decode with sinks on a default input; error vs float64",
                       description="Run one sparse MLA decode call with sinks on random inputs (some -1 ids; "
                                   "with T > 1 one empty row) on this machine, and print the chosen path, the "
                                   "error against the float64 reference and the time of one call. Exits 1 if the "
                                   "output holds NaN or an empty row is not out = 0, lse = -inf.")
    from mla_sink.tools.demo import add_demo_arguments

    add_demo_arguments(p)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("info", help="detected platform, versions, and which paths are available",
                       description="Print this machine's platform record (arch, AITER, Triton, Gluon, SM count), the "
                                   "installed versions, which kernel paths can run here and why not, the plan of the "
                                   "demo's call and its path with each KV dtype. No flags.")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("tables", help="check every shipped rule table (tables/*.yaml) as its reader loads it: "
                                      "schema, no gap, no shadowed row, the reader's own checks; exit 2 if one fails",
                       description="Load every shipped rule table (tables/*.yaml) as the library does and check it: "
                                   "schema, every combination of its fields matched by a row, no shadowed row, the "
                                   "reader's checks of its params. One line a table (a failing one: a line a "
                                   "problem); exit status 2 if one fails. Run it after editing a table (most are "
                                   "read only when a call first needs them). No flags.")
    p.set_defaults(func=_cmd_tables)

    try:
        from mla_sink.tools.bench import register as register_bench
    except ImportError:  # the benchmark needs optional extras; the rest of the CLI does not
        register_bench = None
    if register_bench is not None:
        register_bench(sub)
    parser.commands = sub.choices
    return parser


def _args_after(argv: list, command: str) -> list:
    """The arguments after ``command``'s first place in ``argv`` (none where it is absent)."""
    return argv[argv.index(command) + 1:] if command in argv else []


def _joined_number_values(argv: list) -> list:
    """``--logit-cap -inf`` as ``--logit-cap=-inf``, ``--topk -1e3`` as ``--topk=-1e3``: argparse reads a value that
    starts with ``-`` and is not a plain number as the next flag ("expected one argument", naming no value); joined,
    the flag's own parser or the library's check names the value. Every long flag followed by a token that reads as a
    number is joined, abbreviations argparse accepts included (``--logit -1e3``: a break test, forty-third session;
    the int flags, forty-eighth); an ambiguous or unknown one is left for argparse to name, a flag that takes no value
    gets argparse's "ignored explicit argument"."""
    out, i = [], 0
    while i < len(argv):
        flag = argv[i]
        is_long_flag = len(flag) > 2 and flag.startswith("--") and "=" not in flag
        if is_long_flag and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            try:
                float(argv[i + 1])
            except ValueError:
                pass
            else:
                out.append(f"{flag}={argv[i + 1]}")
                i += 2
                continue
        out.append(flag)
        i += 1
    return out


class _ClosedPipeSafe:
    """``sys.stdout`` for one command: output piped into a reader that quits early (``| head``, ``| true``) makes a
    write or flush raise ``BrokenPipeError``; from then on the stream's descriptor points at ``/dev/null``, so the
    command runs to its end and exits with its own status (a break test, fortieth session: the status of a refused
    ``explain | true`` was 0 or 120 - the interrupted command's, or Python's failed flush at exit - not 2)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def _to_devnull(self) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # a stream without a descriptor (a test's capture)
            pass

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _refusal_line(e: Any, path: Optional[str]) -> str:
    """The one line a refused call puts on stderr beside its explanation on stdout (a script reading stderr saw nothing
    of a refused ``--path``: a break test): the refusal row, or that no row serves the call (with ``--path``, naming
    it)."""
    row = e.selection.row
    if row is not None:
        return f"the call is refused by row {row.id} of tables/mla_decode.yaml (stdout says why)"
    forced = f"--path {path}: " if path else ""
    return f"{forced}no row of tables/mla_decode.yaml serves this call here (stdout says why each row was rejected)"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``mla-sink`` console script."""
    from mla_sink.core.select import NoKernelError
    from mla_sink.dispatch import TableCheckError

    argv = _joined_number_values(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # reported by the parser of the command they follow (``mla-sink demo: error: ...``)
        parser.error_from_command(args.command, argv, extras)
    if args.command == "explain":  # its own arguments, for --matrix's check of the call flags given
        args.explain_argv = _args_after(argv, "explain")
    stdout, sys.stdout = sys.stdout, _ClosedPipeSafe(sys.stdout)
    try:
        rc = args.func(args)
        rc = rc if isinstance(rc, int) else 0  # some commands return their report
    except NoKernelError as e:  # a refusal: the explanation, one error line on stderr, exit 2
        rc = 2
        print(e.explanation)
        print(f"error: {_refusal_line(e, getattr(args, 'path', None))}", file=sys.stderr)
    except ValueError as e:  # bad input: one line naming the argument (and the flag that gave it), exit 2
        print(f"error: {flag_named(str(e))}", file=sys.stderr)
        rc = 2
    except TableCheckError as e:  # an edited table with a gap or a shadowed row: the checker's problems, exit 2
        print(f"error: {e}", file=sys.stderr)
        rc = 2
    except LookupError as e:  # a tuning table with a gap where no declared value shows it (`mla-sink tables` finds
        if type(e) is not LookupError:  # it); a KeyError or IndexError is a bug: its traceback stays
            raise
        print(f"error: {e}", file=sys.stderr)
        rc = 2
    finally:
        sys.stdout.flush()
        sys.stdout = stdout
    return rc


if __name__ == "__main__":
    sys.exit(main())
