"""mla-sink: the decode step of sparse Multi-head Latent Attention with learnable attention sinks.

Public API::

    from mla_sink import sparse_mla_decode, run, prepare, describe, CallSpec, Platform
    out, lse = sparse_mla_decode(q, kv_cache, indices, sinks=sinks)

Semantics are defined by :mod:`mla_sink.reference` (float64); the kernel path of a call is chosen by
the rule table ``tables/mla_decode.yaml`` and explained by ``mla-sink explain``.
"""

from .describe import describe
from .inputs import DecodeInputs
from .layer import SparseMLADecode
from .plan import LaunchPlan
from .records import CallSpec, Platform, call_key
from .reference import sparse_mla_decode_reference
from .run import prepare, run, sparse_mla_decode
from .select import NoKernelError, explain_call, plan_call, select

__version__ = "0.1.0"

__all__ = [
    "CallSpec", "DecodeInputs", "LaunchPlan", "NoKernelError", "Platform", "SparseMLADecode", "call_key",
    "describe", "explain_call", "plan_call", "prepare", "run", "select", "sparse_mla_decode",
    "sparse_mla_decode_reference",
]
