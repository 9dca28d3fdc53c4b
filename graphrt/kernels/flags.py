"""device_error flag bits, one per failure a kernel guards against (OR-ed into a [1] int32 tensor).

Shared by the Triton kernels and their torch references (kernels/reference.py), so neither side
imports the other: this module imports nothing.

    ERR_SEQ_LEN   1   a seq_len outside [0, max_context_len] (the row is run as empty)
    ERR_PAGE_ID   2   a page id outside the KV pool (read as page 0, never written)
    ERR_GRID      4   a request's work tiles did not fit the captured grid (kernels/prepare.py)
    ERR_KV_SLOT   8   a K/V slot past the block table's width or height (the write is skipped)
    ERR_POSITION 16   a position outside the RoPE table (q written as zeros, K/V not written)
    ERR_STALL    32   a persistent-step wait hit its spin bound (kernels/persistent/sync.py)
"""
ERR_SEQ_LEN = 1
ERR_PAGE_ID = 2
ERR_GRID = 4
ERR_KV_SLOT = 8
ERR_POSITION = 16
ERR_STALL = 32

__all__ = ["ERR_SEQ_LEN", "ERR_PAGE_ID", "ERR_GRID", "ERR_KV_SLOT", "ERR_POSITION", "ERR_STALL"]
