"""Immutable call records: :class:`CallSpec` (what is asked) and :class:`Platform` (where it runs).

Both are ``attrs`` frozen classes validated at construction: a bad field raises ``ValueError``
naming the field, the value and what is allowed, e.g.
``'num_heads' must be an int >= 1 (got 0)``. Both have a canonical ``str()`` key used in logs,
test ids and benchmark case names; :func:`call_key` joins them as
``bf16-h64-gfx942-sinks-dcp1``. The records are hashable and serve as cache keys.
"""

from __future__ import annotations

import numbers
import re
from typing import Any, Optional

import attrs
from packaging.version import InvalidVersion, Version

from mla_sink.core.dtypes import DTYPE_KEYS, KV_DTYPE_KEYS, allowed_dtype_pairs, pair_error
from mla_sink.core.trace import brief

D_QK = 576  #: 512 latent + 64 RoPE dims of a DeepSeek-style MLA query/key.
D_V = 512  #: latent dims that serve as the value.

_DTYPES = tuple(sorted(DTYPE_KEYS.values()))
_KV_DTYPES = KV_DTYPE_KEYS
#: A compile target; on NVIDIA ``sm`` and the compute capability's digits (as :func:`mla_sink.core.platform.arch_of`
#: writes them), which :attr:`Platform.cuda_arch` reads from the group ``cc``.
_ARCH_RE = re.compile(r"^(gfx[1-9][0-9]{1,3}[a-z]?|sm(?P<cc>[1-9][0-9]{1,2})|cpu)$")
#: Any ``sm`` name with digits and NVIDIA's feature suffix if any (``a`` arch-specific, ``f`` family; another letter
#: names no target: ``sm90x`` is refused), for :func:`canonical_arch` to read (leading zeros included; the target's own
#: check is :data:`_ARCH_RE`: a compute capability of two or three digits, the first not 0).
_NV_NAME_RE = re.compile(r"sm_?(?P<cc>[0-9]+)[af]?")
#: A ROCm target id, the processor and its feature settings (``gfx942:sramecc+:xnack-``, as PyTorch's
#: ``gcnArchName`` reports it; LLVM AMDGPU docs, "Target ID"), for :func:`canonical_arch` to read.
_AMD_TARGET_ID_RE = re.compile(r"(?P<name>gfx[0-9a-z]+)(?::[a-z0-9_]+[+-])+")


def _as_int(value: Any) -> Any:
    """numpy and other integral scalars -> int (bools and non-integers pass through to be refused)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        return int(value)
    return value


#: The largest count a record takes: the kernels take heads, topk and rank counts as int32 arguments.
COUNT_MAX = 2 ** 31 - 1
#: The largest topk: the kernels step int32 id positions (a split's end, ``start + ids_per_split``, and the blocks a
#: producer loads ahead) past the last id, so topk leaves int32 room above it. 2^31 - 1 ids planned in 32 splits lost
#: the last (its end wrapped negative), and in one split read out of bounds (H200; a break test, thirty-ninth
#: session); served topk are thousands.
TOPK_MAX = 2 ** 30
#: Why topk is bounded by :data:`TOPK_MAX`, for the refusals that name the bound (the records, the call's checks).
TOPK_WHY = "2^30: the kernels step int32 id positions past the last id"
#: Rows of a pool the kernels index with a 32-bit unsigned compare: a larger pool's row count is passed as this
#: (ids are int32, so no id reaches past it; the rows themselves are addressed with 64-bit offsets).
MAX_ROWS = 2 ** 31


#: The largest ``kv_cache_bytes`` a record takes: a pool's byte span, which PyTorch's int64 sizes hold.
BYTES_MAX = 2 ** 63 - 1


def _byte_count(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= BYTES_MAX:
        raise ValueError(f"'{attribute.name}' must be an int in [0, 2^63 - 1] (got {brief(value)})")


def _int_at_least(lo: int):
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ValueError(f"'{attribute.name}' must be an int >= {lo} (got {brief(value)})")
        if value > COUNT_MAX:  # CLI flags were refused beyond it while the records took them (break test)
            raise ValueError(f"'{attribute.name}' must be an int <= {COUNT_MAX}: the kernels take it as an int32 "
                             f"(got {brief(value)})")

    return check


_at_least_1 = _int_at_least(1)


def _topk(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool) and isinstance(value, int) and value > TOPK_MAX:  # its own bound first: the
        # generic one (2^31 - 1) was named for topk = 2^31 (a break test, sixtieth session)
        raise ValueError(f"'topk' must be an int <= {TOPK_MAX} ({TOPK_WHY}; got {brief(value)})")
    _at_least_1(inst, attribute, value)


def _plain_str(value: Any) -> Any:
    """A ``str`` subclass (``numpy.str_``) as the plain ``str`` it spells, so the record's repr and key read the same;
    anything else as given, for the validator to refuse."""
    return str(value) if isinstance(value, str) else value


def _one_of(allowed: tuple):
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, str) or value not in allowed:  # a one-element numpy array passed 'in' and failed
            # later as unhashable (a break test, sixtieth session)
            raise ValueError(f"'{attribute.name}' must be in {allowed} (got {brief(value)})")

    return check


def _bool(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"'{attribute.name}' must be a bool (got {value!r})")


def _to_float(name: str):
    def convert(value: Any) -> float:
        if isinstance(value, (bool, str, bytes)):
            raise ValueError(f"'{name}' must be a finite float (got {value!r})")
        from mla_sink.core.validate import _symbolic  # validate imports this module

        if not isinstance(value, numbers.Real) and not _symbolic(value):
            # a tensor or an array was taken by float() here (a device sync on a GPU tensor) while the function,
            # the layer and the operators refuse it (a break test, sixtieth session); torch.compile's symbolic
            # scalars pass, as they do there
            raise ValueError(f"'{name}' must be a finite float, a Python or numpy real (got {brief(value)})")
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond every float
            raise ValueError(f"'{name}' must be a finite float (got {brief(value)})") from None

    return convert


def _cap(value: Any) -> float:
    """``logit_cap`` as a float, every finite value ``<= 0`` (no cap) as ``0.0``: one key per meaning. A positive
    value whose float is ``0.0`` (a Fraction or numpy longdouble below fp64's range) is refused as
    :func:`mla_sink.core.validate.check_logit_cap` refuses one below ``2^-126``, not read as no cap."""
    f = _to_float("logit_cap")(value)
    if f == 0.0 and type(value) not in (float, int) and isinstance(value, numbers.Real) and value > 0:
        from mla_sink.core.validate import check_logit_cap  # validate imports this module

        check_logit_cap(value)  # raises: positive, below 2^-126 (a break test, sixty-third session)
    return 0.0 if f <= 0.0 and f > float("-inf") else f


def _logit_cap(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    from mla_sink.core.validate import check_logit_cap  # validate imports this module

    check_logit_cap(value)


@attrs.frozen(cache_hash=True)  # a cache key on every call: hash once
class CallSpec:
    """Tensor-free description of one sparse MLA decode call.

    Attributes:
        q_dtype: dtype key of ``q`` (``bf16``, ``fp16``, ``fp8_e4m3``, ``fp8_e4m3fnuz``).
        kv_dtype: dtype key of ``kv_cache``: those of q, or ``fp8_ds_mla`` (the 656-byte V3.2 rows,
            :mod:`mla_sink.core.kv_layout`). Allowed pairs: equal half types, a half q with fp8 KV,
            fp8 q with KV of the same fp8 format, or a half q with ``fp8_ds_mla``.
        num_heads: H, query heads (one shared KV head): an int in ``[1, 2^31 - 1]`` (numpy integers accepted).
        topk: ids per query token in ``indices [T, topk]``: an int in ``[1, 2^30]`` (:data:`TOPK_MAX`).
        sinks: whether a per-head sink logit ``sinks [H]`` is given.
        dcp_world_size: decode-context-parallel ranks the KV pool is sharded over: an int in ``[1, 2^31 - 1]``
            (default 1: no DCP).
        need_lse: whether the chosen path must produce an LSE. Sinks (applied through it) and DCP
            (merged by it) imply it: construction sets it True for them, so ``need_lse=False`` is a
            request the record corrects, never an error. Pass True when the caller wants the LSE back. The record
            keeps the corrected value: ``attrs.evolve(spec, sinks=False)`` of a spec with sinks still needs the
            LSE (key ``-lse``); build a new ``CallSpec`` to drop what the sinks implied.
        logit_cap: soft cap of the scaled scores, ``s = logit_cap * tanh(s / logit_cap)``; ``<= 0`` disables it
            (stored as 0.0);
            a positive cap must lie in ``[2^-126, 2^126]`` (:func:`mla_sink.core.validate.check_logit_cap`).
        kv_rows_packed: whether ``kv_cache``'s rows follow each other without a gap (row ``id`` at ``id * 576``
            elements: a contiguous ``[N, 576]``; :func:`mla_sink.core.kv_layout.rows_packed`), not e.g. a
            ``[N, 576]`` view of rows of 640 (default True). A call's own tensors decide it: :func:`mla_sink.describe`
            reads it from ``kv_cache``, and a call given a spec (:func:`mla_sink.run`, the layer) is planned with its
            ``kv_cache``'s value whatever the spec says (the AITER paths take packed rows only:
            ``tables/mla_decode.yaml``).
        gather_aligned: whether ``q``'s token and head strides and ``kv_cache``'s row stride (its block stride for a
            paged ``[blocks, block_size, 656]`` cache), in elements of each tensor's dtype, are multiples of the stride
            multiple of ``tables/triton_tuning.yaml`` (the ``N`` of the seesaw's ``topk: {multiple_of: N}``, 16), and
            ``indices``' row stride is one too or is ``topk`` (contiguous ids, which that ``topk`` requirement tests):
            :func:`mla_sink.paths.triton.plan.gather_strides_aligned`. Tensors with the contiguous strides of their
            shape have it (a size-1 dimension counts with the stride it has, which torch's ``is_contiguous`` ignores);
            False for e.g. ``q = buf[..., :576]`` of a ``[T, H, 580]`` buffer, a ``[N, 576]`` view of rows of 580, or
            ``indices`` of row stride 1028 at ``topk`` 1024 (default True). The ``gluon_seesaw`` path requires it
            (``tables/triton_tuning.yaml``): a call without it is planned on the portable kernel. A DCP call's
            rank-local decode reads its own fresh ids, so there the ids count as contiguous.
        unit_rows: whether the rows of ``q``, ``kv_cache`` and ``indices`` are unit-stride (``stride(-1) == 1``:
            :func:`mla_sink.paths.triton.plan.rows_unit_stride`; the checks require it of ``q`` and ``kv_cache``,
            so False means e.g. ``indices = ids[:, ::2]``), as both Gluon kernels read them (default True).
            Like ``kv_rows_packed``, a call's own tensors decide both: :func:`mla_sink.describe` reads them, and a
            call given a spec is planned with its tensors' values whatever the spec says.
        kv_cache_bytes: the bytes ``kv_cache`` spans, from its first byte to the end of its last row
            (:func:`mla_sink.core.kv_layout.span_bytes`; ``N * 1152`` for a contiguous bf16 ``[N, 576]``): an int in
            ``[0, 2^63 - 1]`` (default 0: a spec made without tensors, as the layer's, counts as a small pool). A
            call's own tensors decide it, as ``kv_rows_packed``. ``tables/mla_decode.yaml`` keeps the AITER paths
            to pools of at most 2^32 bytes: AITER's MLA decode kernels address rows by a 32-bit byte offset from the
            pool's first byte and read rows past 4 GiB wrongly, with no error (docs/DESIGN.md, AITER facts).

    Raises:
        ValueError: a field is out of its domain, or the (q_dtype, kv_dtype) pair is not allowed (message names
            field, value and allowed values).
    """

    q_dtype: str = attrs.field(converter=_plain_str, validator=_one_of(_DTYPES))
    kv_dtype: str = attrs.field(converter=_plain_str, validator=_one_of(_KV_DTYPES))
    num_heads: int = attrs.field(converter=_as_int, validator=_int_at_least(1))
    topk: int = attrs.field(converter=_as_int, validator=_topk)
    sinks: bool = attrs.field(default=False, validator=_bool)
    dcp_world_size: int = attrs.field(default=1, converter=_as_int, validator=_int_at_least(1))
    need_lse: bool = attrs.field(default=False, validator=_bool)
    logit_cap: float = attrs.field(default=0.0, converter=_cap, validator=_logit_cap)
    kv_rows_packed: bool = attrs.field(default=True, validator=_bool)
    gather_aligned: bool = attrs.field(default=True, validator=_bool)
    unit_rows: bool = attrs.field(default=True, validator=_bool)
    kv_cache_bytes: int = attrs.field(default=0, converter=_as_int, validator=_byte_count)

    def __attrs_post_init__(self) -> None:
        if (self.sinks or self.dcp_world_size > 1) and not self.need_lse:
            object.__setattr__(self, "need_lse", True)  # implied: the sink and the DCP merge go through the LSE
        if (self.q_dtype, self.kv_dtype) not in allowed_dtype_pairs():
            raise ValueError(pair_error(self.q_dtype, self.kv_dtype, "('q_dtype', 'kv_dtype')"))

    def key_parts(self) -> tuple[str, list[str]]:
        """(dtype part, trailing parts) of the canonical key; :func:`call_key` puts the arch between."""
        head = self.q_dtype if self.q_dtype == self.kv_dtype else f"{self.q_dtype}+kv_{self.kv_dtype}"
        tail = [f"h{self.num_heads}", "sinks" if self.sinks else "nosinks", f"dcp{self.dcp_world_size}"]
        if self.need_lse and not (self.sinks or self.dcp_world_size > 1):
            tail.append("lse")
        if self.logit_cap > 0:  # the shortest text that reads back as this float: two caps, two keys ('%g' kept 6
            # digits, so 30 and 30.000001 shared 'cap30')
            cap = repr(float(self.logit_cap))
            tail.append(f"cap{cap[:-2] if cap.endswith('.0') else cap}")
        if not self.kv_rows_packed:
            tail.append("kvstrided")
        if not self.gather_aligned:
            tail.append("unaligned")
        if not self.unit_rows:
            tail.append("rowstrided")
        return head, tail

    def __str__(self) -> str:
        head, tail = self.key_parts()
        return "-".join([head, *tail])


def canonical_arch(value: Any) -> Any:
    """An NVIDIA target in its plain form: the compute capability as written without leading zeros and without a
    feature suffix (``'sm90a'`` -> ``'sm90'``, ``'sm100f'`` -> ``'sm100'``, ``'sm090'`` -> ``'sm90'``, and nvcc's and
    torch's ``'sm_90a'`` -> ``'sm90'``; any name in any case: ``'SM90'`` -> ``'sm90'``, ``'CPU'`` -> ``'cpu'``): the
    suffix (``a`` arch-specific, ``f`` family features) names the same GPUs, and the tables know each target by its
    plain name. AMD names keep their letter (``gfx90a`` is its own GPU) and drop a target id's feature settings
    (``'gfx942:sramecc+:xnack-'`` -> ``'gfx942'``, as :func:`mla_sink.core.platform.arch_of` reads a device);
    anything else (or a form whose plain name would not be a target, as ``'sm09'`` or ``'sm00'``: a compute
    capability of one digit) as given, for :class:`Platform`'s check to refuse by what was written. Used by
    :class:`Platform` and by ``mla-sink explain --arch``."""
    if isinstance(value, str):
        lower = value.lower()  # 'SM90', 'CPU': one target, however it is cased
        m = _NV_NAME_RE.fullmatch(lower)
        if m is not None:
            plain = f"sm{int(m.group('cc'))}"
            return plain if _ARCH_RE.fullmatch(plain) else value
        m = _AMD_TARGET_ID_RE.fullmatch(lower)
        if m is not None:  # the features (sramecc, xnack) do not change which kernels a GPU runs
            return m.group("name")
        if _ARCH_RE.fullmatch(lower):
            return lower
    return value


def _arch(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str) or not _ARCH_RE.fullmatch(value):
        raise ValueError(
            f"'arch' must be a compile target such as 'gfx942', 'gfx950', 'sm80', 'sm90', 'sm100' "
            f"or 'cpu' (got {value!r})"
        )


def _canonical_version(value: Any) -> Any:
    """A PEP 440 version string in its canonical form (``' v0.1.20 '`` -> ``'0.1.20'``; the release numbers made three,
    as PEP 440's equal versions are - zeros past the third dropped, missing ones added: ``'0.1.20.0'`` -> ``'0.1.20'``,
    ``'0.1'`` -> ``'0.1.0'``), so that one version is one record (its key, its ``str``); anything else as given,
    for :func:`_version` to refuse."""
    if isinstance(value, str):
        try:
            v = Version(value)
        except InvalidVersion:
            return value
        release = list(v.release) + [0] * (3 - len(v.release))
        while len(release) > 3 and release[-1] == 0:
            release.pop()
        epoch = f"{v.epoch}!" if v.epoch else ""
        suffix = str(v)[len(epoch + ".".join(map(str, v.release))):]  # str(v): epoch, release, then pre/post/dev/local
        return epoch + ".".join(map(str, release)) + suffix
    return value


def _version(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    try:
        Version(value)
    except (InvalidVersion, TypeError):
        raise ValueError(f"'{attribute.name}' must be None or a PEP 440 version such as '0.1.19' "
                         f"(got {value!r})") from None


@attrs.frozen(cache_hash=True)
class Platform:
    """Where a call runs: the compile target and which kernel libraries are importable.

    Attributes:
        arch: compile target: ``gfx942`` (MI300), ``gfx950`` (MI350), ``sm80``, ``sm90``, ``sm100``,
            ``cpu``, ... (never a capability tuple). An NVIDIA target's feature suffix is dropped (``sm90a`` is
            kept as ``sm90``: the same GPUs, and the tables' name for them).
        aiter_version: installed AITER version (e.g. ``'0.1.20'``), ``None`` when AITER is not
            importable (always ``None`` off ROCm).
        triton: whether Triton can run the kernel here (default True): importable, and on the CPU
            (``arch='cpu'``) its interpreter works with the installed numpy
            (:func:`mla_sink.core.platform.triton_interpreter_ok`).
        gluon: whether Triton's Gluon dialect (the warp-specialised kernels of
            :mod:`mla_sink.kernels.gluon`) imports here; default: as ``triton``, and always False without
            Triton (``triton=False`` corrects ``gluon=True``, as in ``attrs.evolve(p, triton=False)``; the
            record keeps the corrected value, so ``attrs.evolve(p, triton=True)`` of such a platform still has
            ``gluon=False``: pass ``gluon=True`` too, or build a new ``Platform``). Which
            archs and calls those kernels serve is the tuning table's answer (``tables/triton_tuning.yaml``).
        num_sms: streaming multiprocessors (compute units) of the device, which the split-KV decision
            of the ``triton`` path reads; ``None`` when unknown (then ``mla-sink explain`` leaves the
            split count open); 1 on the CPU (or ``None``: Triton's interpreter runs one program at a time).
        aiter_experimental: whether AITER's experimental kernels are switched on (the environment variable
            ``AITER_ENABLE_EXPERIMENTAL`` read as AITER reads it, an int other than 0; default False), which sends
            some fp8 calls to a kernel that takes no per-tensor scales and writes no LSE
            (``tables/mla_decode.yaml``); True needs an ``aiter_version``. :func:`mla_sink.core.platform.
            detect_platform` reads it once per device, where AITER is importable.

    Build one explicitly to ask about any machine from a laptop; :func:`detect` reads this one.

    Raises:
        ValueError: unknown arch string or unparsable version; ``triton`` or ``aiter_experimental`` not a bool,
            ``gluon`` neither a bool nor ``None``; ``aiter_experimental`` True without an ``aiter_version``;
            ``num_sms`` not an int in ``[1, 2^31 - 1]``, or other than 1 on ``cpu``. Which archs AITER serves is the rule table's (``tables/mla_decode.yaml``, the AITER paths'
            ``requires``): an ``aiter_version`` on any other arch makes those paths ineligible, with that reason.
    """

    arch: str = attrs.field(converter=canonical_arch, validator=_arch)
    aiter_version: Optional[str] = attrs.field(default=None, converter=_canonical_version, validator=_version)
    triton: bool = attrs.field(default=True, validator=_bool)
    gluon: Optional[bool] = attrs.field(default=None)
    num_sms: Optional[int] = attrs.field(default=None, converter=_as_int)
    aiter_experimental: bool = attrs.field(default=False, validator=_bool)

    def __attrs_post_init__(self) -> None:
        if self.gluon is None:
            object.__setattr__(self, "gluon", self.triton)
        if not isinstance(self.gluon, bool):
            raise ValueError(f"'gluon' must be a bool or None (got {self.gluon!r})")
        if self.gluon and not self.triton:  # Gluon is Triton's dialect: implied False, as CallSpec corrects need_lse
            object.__setattr__(self, "gluon", False)
        if self.num_sms is not None and (isinstance(self.num_sms, bool) or not isinstance(self.num_sms, int)
                                         or not 1 <= self.num_sms <= COUNT_MAX):
            raise ValueError(f"'num_sms' must be None or an int in [1, {COUNT_MAX}] (got {brief(self.num_sms)})")
        if self.aiter_experimental and self.aiter_version is None:  # AITER's switch, without AITER
            raise ValueError("'aiter_experimental' describes AITER's kernels: it must be False without an "
                             "aiter_version (got True with aiter_version None)")
        if self.arch == "cpu" and self.num_sms not in (None, 1):  # a plan would split for SMs it does not have
            raise ValueError(f"'num_sms' counts a GPU's SMs / CUs; arch 'cpu' runs Triton's interpreter, one program "
                             f"at a time, as one SM (got {self.num_sms}; leave it None or pass 1)")

    @property
    def cuda_arch(self) -> Optional[int]:
        """An NVIDIA target's compute capability as one number (``sm89`` -> 89, ``sm90a`` -> 90, ``sm100`` -> 100);
        ``None`` on any other target. The rule table compares it (``tables/mla_decode.yaml``, field ``cuda_arch``)."""
        cc = _ARCH_RE.fullmatch(self.arch).group("cc")  # the validator matched it
        return None if cc is None else int(cc)

    def __str__(self) -> str:
        aiter = f"aiter{self.aiter_version}" if self.aiter_version else "noaiter"
        experimental = "-experimental" if self.aiter_experimental else ""
        return f"{self.arch}-{aiter}{experimental}-{'triton' if self.triton else 'notriton'}"

    @classmethod
    def detect(cls, device: Any = None) -> "Platform":
        """Read the current machine (see :func:`mla_sink.core.platform.detect_platform`).

        Args:
            device: a ``torch.device`` or its name (``'cpu'``, ``'cuda:0'``); ``None``: the current device (a
                GPU when one is visible, else the CPU).

        Returns:
            The :class:`Platform` of that device (cached per device).

        Raises:
            ValueError: ``device`` is not a device (or its name), not a cpu or cuda one, or names a CUDA/ROCm
                device this machine does not have.
        """
        from mla_sink.core.platform import detect_platform

        return detect_platform(device)


def check_spec(spec: Any) -> None:
    """Raises ValueError unless ``spec`` is a :class:`CallSpec` (the message says how to build one;
    :func:`mla_sink.describe` returns the pair ``(spec, platform)``)."""
    if not isinstance(spec, CallSpec):
        raise ValueError(f"'spec' must be a mla_sink.CallSpec (got {type(spec).__name__}); build one with "
                         "CallSpec(q_dtype='bf16', kv_dtype='bf16', num_heads=..., topk=...) or take the first of "
                         "spec, platform = mla_sink.describe(...)")


def check_platform(platform: Any, *, optional: bool = False) -> None:
    """Raises ValueError unless ``platform`` is a :class:`Platform` (or None, where ``optional``); the message says
    how to build one."""
    if not (isinstance(platform, Platform) or (optional and platform is None)):
        raise ValueError(f"'platform' must be a mla_sink.Platform{' or None' if optional else ''} (got {platform!r}); "
                         "build one with Platform('gfx942', aiter_version='0.1.20') or Platform.detect()")


def check_records(spec: Any, platform: Any) -> None:
    """Raises ValueError unless ``spec`` is a :class:`CallSpec` and ``platform`` a :class:`Platform` (the
    message says how to build one)."""
    check_spec(spec)
    check_platform(platform)


def call_key(spec: CallSpec, platform: Platform) -> str:
    """Canonical key of a call on a platform, e.g. ``bf16-h64-gfx942-sinks-dcp1``.

    Args:
        spec: the call (:class:`CallSpec`). platform: where it runs (:class:`Platform`).

    Returns:
        ``<dtypes>-h<H>-<arch>-<sinks|nosinks>-dcp<W>`` (dtypes ``<q>`` when KV has q's dtype, e.g. ``bf16``,
        else ``<q>+kv_<kv>``), then
        ``-lse`` when the LSE was asked for without sinks or DCP, ``-cap<logit_cap>`` with a cap, ``-kvstrided``
        for a ``kv_cache`` whose rows are not packed, ``-unaligned`` without ``gather_aligned`` and ``-rowstrided``
        without ``unit_rows``. Used in logs, test ids and benchmark case names. It names the call's family, not its
        plan: ``topk``, ``kv_cache_bytes`` and the platform's AITER version, Triton / Gluon availability and SM count
        are left out, so calls of one key can take different kernels (topk 64 and 72 at 64 heads on an sm90, or
        with and without Gluon); ``mla-sink explain`` and the plan (``prepare``) say which kernel a call takes.

    Raises:
        ValueError: ``spec`` or ``platform`` is not the record.
    """
    check_records(spec, platform)
    head, tail = spec.key_parts()
    return "-".join([head, tail[0], platform.arch, *tail[1:]])
