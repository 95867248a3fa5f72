"""mla-sink: the decode step of sparse Multi-head Latent Attention with learnable attention sinks.

Public API::

    from mla_sink import sparse_mla_decode, SparseMLADecode, run, prepare, describe, CallSpec, Platform
    out, lse = sparse_mla_decode(q, kv_cache, indices, sinks=sinks)
    kv_cache = mla_sink.quantize_kv_cache(kv, layout="fp8_ds_mla")   # the 656-byte V3.2 FP8 rows

The pipeline (``describe -> validate -> select -> plan -> launch -> finalize``) lives in
:mod:`mla_sink.core`; the paths' launchers in :mod:`mla_sink.paths`; the kernels in
:mod:`mla_sink.kernels` (``triton/``, ``gluon/``); the command-line tools in :mod:`mla_sink.tools`.
Semantics are defined by :mod:`mla_sink.core.reference` (float64); the kernel path of a call is chosen
by the rule table ``tables/mla_decode.yaml`` and explained by ``mla-sink explain``.

Also: the operators ``torch.ops.mla_sink.sparse_mla_decode`` / ``sparse_mla_decode_out`` (:mod:`mla_sink.ops`,
registered on import) for ``torch.compile`` and CUDA graphs; decode context parallel through ``run`` / the layer
with ``dcp_world_size > 1`` and :mod:`mla_sink.core.dcp` (docs/DCP.md); the command line ``mla-sink --help``.
"""


def _mount_dispatch() -> None:
    """Make the generic rule-table engine importable as ``mla_sink.dispatch``.

    The engine lives in the repository's top-level ``dispatch/`` folder; a wheel installs it as the
    subpackage ``mla_sink.dispatch`` (pyproject.toml maps the folder), never as a top-level ``dispatch``
    (a PyPI distribution of that name exists). A source checkout run with ``PYTHONPATH=.`` loads the
    folder beside this package under the same name.
    """
    import importlib.util
    import sys
    from pathlib import Path

    if "mla_sink.dispatch" in sys.modules:
        return
    here = Path(__file__).resolve().parent
    if (here / "dispatch" / "__init__.py").is_file():
        return  # installed: the wheel holds the engine as the subpackage mla_sink/dispatch
    root = here.parent
    source = root / "dispatch" / "__init__.py"
    if not (source.is_file() and (root / "pyproject.toml").is_file() and (root / "tables").is_dir()):
        return  # not our source checkout (a foreign top-level "dispatch" beside an installed copy is never used)
    spec = importlib.util.spec_from_file_location("mla_sink.dispatch", source,
                                                  submodule_search_locations=[str(source.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["mla_sink.dispatch"] = module
    spec.loader.exec_module(module)


_mount_dispatch()

from mla_sink.api import prepare, run, sparse_mla_decode  # noqa: E402
from mla_sink.core.describe import describe  # noqa: E402
from mla_sink.core.inputs import DecodeInputs  # noqa: E402
from mla_sink.core.kv_layout import dequantize_kv_cache, quantize_kv_cache  # noqa: E402
from mla_sink.core.plan import LaunchPlan  # noqa: E402
from mla_sink.core.records import CallSpec, Platform, call_key  # noqa: E402
from mla_sink.core.reference import sparse_mla_decode_reference  # noqa: E402
from mla_sink.core.select import NoKernelError, explain_call, plan_call, select  # noqa: E402
from mla_sink.layer import SparseMLADecode  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CallSpec", "DecodeInputs", "LaunchPlan", "NoKernelError", "Platform", "SparseMLADecode", "call_key",
    "dequantize_kv_cache", "describe", "explain_call", "plan_call", "prepare", "quantize_kv_cache", "run", "select",
    "sparse_mla_decode", "sparse_mla_decode_reference",
]
