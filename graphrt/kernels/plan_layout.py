"""Where a split-KV decode schedule lives in an int workspace: the type the prepare kernel writes to.

graphrt's own description of a plan (the kernels' level, so `kernels/prepare.py` imports nothing
above it). How FlashInfer lays these arrays out, which versions, and the parsing and parity checks
against its plan() stay in `graphrt/attention/flashinfer_layout.py`, the one module that knows
FlashInfer's private layout; it builds the `PlanSpec`s.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

ABSENT = -1  # byte offset of an array the plan does not use


@dataclass(frozen=True)
class PlanSpec:
    """Everything the device planner needs for one bucket; fixed once the graph is captured.

    Offsets are byte offsets into the int workspace (uint8, device; ABSENT = -1 when the array is
    not used). `budget` is the most work tiles a split schedule may use (0 = no split: one tile per
    request). `min_chunk_pages` is the lower bound of the chunk-size search; `empty_counts_one`
    says whether the search counts an empty request as one tile (tensor-core path) or zero
    (CUDA-core path).
    """

    kind: str
    batch_size: int
    page_size: int
    padded_batch_size: int
    split_kv: bool
    budget: int
    min_chunk_pages: int
    empty_counts_one: bool
    request_indices: int
    qo_tile_indices: int
    kv_tile_indices: int
    o_indptr: int
    merge_indptr: int
    kv_chunk_size: int
    total_num_rows: int
    block_valid_mask: int
    int_workspace_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)
