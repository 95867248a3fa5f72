"""``mla-sink demo``: run the main job on a default input and report path, error vs float64, time."""

from __future__ import annotations

import argparse
import os
import time

import torch

from mla_sink.core.dtypes import DS_MLA_KEYS, FP8_KEYS, HALF_KEYS, KV_DTYPE_KEYS, TORCH_DTYPES
from mla_sink.core.records import COUNT_MAX, TOPK_MAX, call_key
from mla_sink.tools.flags import CLI_UNSET_PATH, check_count, check_not_empty, check_seed

_DTYPES = list(KV_DTYPE_KEYS)
_DEFAULT_Q_DTYPE = "bf16"  # the demo's q dtype unless --q-dtype or a half-precision --kv-dtype says otherwise


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``mla-sink demo`` options (shape, dtypes, device, forced path, seed) to ``p``."""
    p.add_argument("--tokens", type=int, default=4, help="T, query tokens (default 4)")
    p.add_argument("--heads", type=int, default=16, help="H, query heads (default 16)")
    p.add_argument("--topk", type=int, default=256, help="topk, ids per token in indices [T, topk] (default 256)")
    p.add_argument("--pool-rows", "--pool", dest="pool", type=int, default=4096,
                   help="N, rows in the KV pool (default 4096; --pool-rows as the bench names it)")
    p.add_argument("--q-dtype", "--dtype", dest="dtype", default=None, choices=sorted(HALF_KEYS),
                   help="q dtype (default: the KV dtype when that is bf16 or fp16, else bf16; --q-dtype as explain "
                        "names it)")
    p.add_argument("--kv-dtype", default=None, choices=_DTYPES,
                   help="KV dtype (default: q dtype; fp8_ds_mla: the 656-byte V3.2 FP8 rows, pow2 scales)")
    p.add_argument("--no-sinks", action="store_true", help="run without sinks (default: random fp32 sinks [H])")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--path", default=None,
                   help="force a kernel path of tables/mla_decode.yaml, e.g. triton or reference (default: the "
                        "rule table's choice)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs, in [0, 2^64 - 1] (default 0)")


def demo_dtypes(args: argparse.Namespace) -> tuple:
    """``(q_dtype, kv_dtype)`` keys of the demo's call: ``--q-dtype`` (default: the KV dtype when that is
    bf16 or fp16, else bf16) and ``--kv-dtype`` (default: the q dtype)."""
    q_dtype = args.dtype or (args.kv_dtype if args.kv_dtype in HALF_KEYS else _DEFAULT_Q_DTYPE)
    return q_dtype, args.kv_dtype or q_dtype


def demo_bytes(tokens: int, heads: int, topk: int, pool: int) -> int:
    """Bytes the demo allocates at most: :func:`make_inputs`'s tensors (fp32 staging of q and the pool, the pool
    in its dtype, the ids and their drop mask) and the float64 reference's gathered rows, for the error of a
    demo too large to allocate."""
    return tokens * heads * 576 * (4 + 2) + pool * 576 * (4 + 2) + tokens * topk * (4 + 4 + 1 + 576 * 8)


def memory_bytes(device: str):
    """The memory of ``device`` in bytes (a CUDA device's total, the CPU's physical memory), or None where it
    cannot be read (then only the allocation itself can fail)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX sysconf name here
        return None


def make_inputs(tokens: int, heads: int, topk: int, pool: int, dtype: str, kv_dtype: str, device: str,
                sinks: bool, seed: int = 0) -> dict:
    """Random demo tensors: ~1/8 of ids are -1 (anywhere in a row), one row entirely -1."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(tokens, heads, 576, generator=g).to(TORCH_DTYPES[dtype])
    kv32 = torch.randn(pool, 576, generator=g)
    extra: dict = {}
    if kv_dtype in DS_MLA_KEYS:
        from mla_sink.core.kv_layout import quantize_kv_cache

        kv = quantize_kv_cache(kv32, layout=kv_dtype)
    elif kv_dtype in FP8_KEYS:
        kv_scale = kv32.abs().amax() / 224.0
        kv = (kv32 / kv_scale).to(TORCH_DTYPES[kv_dtype])
        extra["kv_scale"] = kv_scale.reshape(1).float().to(device)
    else:
        kv = kv32.to(TORCH_DTYPES[kv_dtype])
    indices = torch.randint(0, pool, (tokens, topk), generator=g, dtype=torch.int32)
    drop = torch.rand(tokens, topk, generator=g) < 0.125
    indices[drop] = -1
    if tokens > 1:
        indices[-1] = -1  # a row with no valid id: out = 0, lse = -inf
    out = dict(q=q.to(device), kv_cache=kv.to(device), indices=indices.to(device), **extra)
    if sinks:
        out["sinks"] = (torch.randn(heads, generator=g) * 2).float().to(device)
    return out


def run_demo(args: argparse.Namespace) -> int:
    """Run the main job on :func:`make_inputs`, print the chosen path, error vs float64 and time.

    Returns:
        0 when the output has no NaN and empty rows give ``out = 0``, ``lse = -inf``; else 1.

    Raises:
        ValueError: an unknown ``--path``, a shape option outside ``[1, 2^31 - 1]``, a seed outside
            ``[0, 2^64 - 1]``, an empty or unusable ``--device``, or shapes whose tensors cannot be allocated
            (naming the flags).
    """
    from mla_sink.api import sparse_mla_decode
    from mla_sink.core.describe import describe
    from mla_sink.core.reference import sparse_mla_decode_reference
    from mla_sink import dispatch
    from mla_sink.core.select import check_path

    check_path(args.path, unset=CLI_UNSET_PATH)  # refused before the call's header is printed
    for flag, dest, high in (("--tokens", "tokens", COUNT_MAX), ("--heads", "heads", COUNT_MAX),
                             ("--topk", "topk", TOPK_MAX), ("--pool-rows", "pool", COUNT_MAX)):
        check_count(flag, getattr(args, dest), high=high)  # named by the flag's first spelling, as --help lists it
    check_seed("--seed", args.seed)
    check_not_empty("--device", args.device, "cuda when available, else cpu")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"'--device' must be cpu or cuda (got {device!r})")
    on_gpu = kind == "cuda"  # by the device's type: "cpu:0" is the CPU too
    if on_gpu and not torch.cuda.is_available():
        raise ValueError(f"'--device' is {device!r} but this machine has no CUDA/ROCm GPU (use --device cpu)")
    q_dtype, kv_dtype = demo_dtypes(args)
    need = demo_bytes(args.tokens, args.heads, args.topk, args.pool)
    too_big = (f"'--tokens' {args.tokens}, '--heads' {args.heads}, '--topk' {args.topk} and '--pool-rows' {args.pool} "
               f"need about {need / 2 ** 30:.3g} GiB of demo tensors, more than {device} %s: choose smaller sizes")
    have = memory_bytes(device)
    if have is not None and need > have:  # refused before allocating (an allocation that fits the address space
        raise ValueError(too_big % f"has ({have / 2 ** 30:.3g} GiB)")  # but not memory can end in an OOM kill)
    try:
        x = make_inputs(args.tokens, args.heads, args.topk, args.pool, q_dtype, kv_dtype, device,
                        not args.no_sinks, args.seed)
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        if not any(w in str(e).lower() for w in ("alloc", "out of memory", "overflow")):
            raise
        raise ValueError(too_big % "could allocate") from None
    spec, platform = describe(x["q"], x["kv_cache"], x["indices"], x.get("sinks"), return_lse=True)
    # One key for the call: call_key (the explanation below repeats it; that line is dropped).
    print(f"call: {call_key(spec, platform)} on {platform}; T={args.tokens} topk={args.topk} pool N={args.pool}")
    if args.path == "reference":  # always honoured, no row consulted (mla_sink.core.select.plan_call)
        print("  → reference   (forced: the float64 reference runs anywhere)")
    else:
        from mla_sink.core.plan import build_plan
        from mla_sink.core.select import NoKernelError, select
        from mla_sink.tools.explain import launch_lines

        try:  # the plan the call below runs (the library plans it the same way: one cached record)
            plan = build_plan(spec, platform, num_tokens=args.tokens, path=args.path)
        except NoKernelError:  # run() below raises it with the full explanation (exit 2)
            pass
        else:
            key = call_key(spec, platform)  # printed above: not again
            sel = select(spec, platform, path=args.path)
            text = [line for line in dispatch.explain(sel, key=key).splitlines() if line.strip() != key]
            winner = [line for line in text if not line.lstrip().startswith("✗ ")]
            print("\n".join(winner))
            # the launch, as explain prints it: which kernel runs the call, its splits and the rows that chose them
            # (before, the demo named the path only)
            for line in launch_lines(plan):
                print(line)
            # the rows, not the explanation's lines (which group the rows of one path on one line)
            print(f"  ({len(sel.rejected)} earlier rows rejected; `mla-sink explain` lists why)")
    out, lse = sparse_mla_decode(**x, return_lse=True, path=args.path)  # warm-up / compile
    if on_gpu:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out, lse = sparse_mla_decode(**x, return_lse=True, path=args.path)
    if on_gpu:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    ref_out, ref_lse = sparse_mla_decode_reference(
        x["q"], x["kv_cache"], x["indices"], x.get("sinks"), kv_scale=x.get("kv_scale"))
    err = (out.double() - ref_out).abs().max().item()
    finite = torch.isfinite(ref_lse)
    lse_err = (lse[finite].double() - ref_lse[finite].double()).abs().max().item() if finite.any() else 0.0
    empty_ok = bool((out[~finite].float() == 0).all()) and bool(torch.isneginf(lse[~finite]).all())
    nan = bool(out.isnan().any())
    n_empty = int((~finite).any(dim=1).sum())
    empty_txt = f"{n_empty} empty row(s) -> out 0, lse -inf: {empty_ok}" if n_empty else "no empty rows"
    print(f"max |out - float64| = {err:.3e}   max |lse - float64| = {lse_err:.3e}   {empty_txt}   NaN in out: {nan}")
    from mla_sink.api import prepare

    ran = prepare(spec, platform, path=args.path).path
    where = ", Triton interpreter" if (not on_gpu and ran == "triton") else ""
    print(f"time: {elapsed * 1e3:.2f} ms (one call after a warm-up; path {ran}{where})")
    return 0 if (not nan and empty_ok) else 1
