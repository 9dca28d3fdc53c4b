"""Triton kernels graphrt runs inside its graphs (all testable on CPU with TRITON_INTERPRET=1)."""
from graphrt.kernels.prepare import ERR_GRID, ERR_PAGE_ID, ERR_SEQ_LEN, PrepareLaunch

__all__ = ["PrepareLaunch", "ERR_SEQ_LEN", "ERR_PAGE_ID", "ERR_GRID"]
