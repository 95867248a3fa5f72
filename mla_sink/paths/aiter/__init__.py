"""The AITER paths (``aiter_persistent``, ``aiter_lse``, ``aiter_lse_single_split``,
``aiter_lse_fp8_two_split``): pure planners, device buffers, the launcher and finalize.

Importing this package never imports AITER; :func:`launch_aiter` imports it lazily when it runs
without an explicit ``impl``.

* :func:`plan_aiter` -> :class:`AiterCall` (:class:`AiterDecodeCall` | :class:`AiterPersistentCall`):
  the exact ``aiter.mla.mla_decode_fwd`` call of a plan for T tokens, as data (head padding, splits
  and ``return_lse`` from the plan's params, i.e. ``tables/mla_decode.yaml``);
  :func:`with_meta_param` resolves a split count that waits for AITER's heuristic.
* :func:`plan_aiter_launch` -> that one call, or, for more id slots (``T * topk``) than one AITER call indexes
  (:data:`MAX_ID_SLOTS`, AITER's int32 offsets), :class:`AiterChunkedCall`: the call as consecutive token chunks.
* :func:`fill_kv_buffers`: ragged ``kv_indptr`` / compacted ``kv_indices`` from the valid ids, no
  host sync.
* :func:`launch_aiter`: plan (or the plan's cached ``launch``) -> :func:`run_call`: buffers ->
  AITER -> :func:`finalize_aiter` (empty rows, sinks, heads), once per chunk.
"""

from mla_sink.paths.aiter.buffers import AiterBuffers, allocate_buffers, fill_kv_buffers, row_counts, valid_id_mask
from mla_sink.paths.aiter.chunks import AiterChunkedCall, AiterLaunch, plan_aiter_launch, resolve_calls
from mla_sink.paths.aiter.finalize import finalize_aiter
from mla_sink.paths.aiter.launch import (
    METADATA_NAMES,
    AiterImpl,
    AiterWorkspace,
    aiter_meta_param,
    launch_aiter,
    load_aiter_impl,
    run_call,
)
from mla_sink.paths.aiter.plan import (
    AITER_PATHS,
    MAX_ID_SLOTS,
    MAX_SEQLEN_Q,
    AiterCall,
    AiterDecodeCall,
    AiterPersistentCall,
    PersistentMetadata,
    plan_aiter,
    with_meta_param,
)

__all__ = [
    "AITER_PATHS", "MAX_ID_SLOTS", "MAX_SEQLEN_Q", "METADATA_NAMES",
    "AiterBuffers", "AiterCall", "AiterChunkedCall", "AiterDecodeCall", "AiterImpl", "AiterLaunch",
    "AiterPersistentCall", "AiterWorkspace", "PersistentMetadata", "aiter_meta_param", "allocate_buffers",
    "fill_kv_buffers", "finalize_aiter", "launch_aiter", "load_aiter_impl", "plan_aiter", "plan_aiter_launch",
    "resolve_calls", "row_counts", "run_call", "valid_id_mask", "with_meta_param",
]
