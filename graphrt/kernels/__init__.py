"""Triton kernels graphrt runs inside its graphs (all testable on CPU with TRITON_INTERPRET=1),
and their torch references (`reference.py`: the kernel tests' oracle and the CPU path's kernels;
`ops.py` picks one set per model). Importing this package imports no Triton: `PrepareLaunch`
loads kernels/prepare.py on first use."""
from graphrt.kernels.flags import ERR_GRID, ERR_PAGE_ID, ERR_SEQ_LEN


def __getattr__(name):
    if name == "PrepareLaunch":
        from graphrt.kernels.prepare import PrepareLaunch
        return PrepareLaunch
    raise AttributeError(f"module 'graphrt.kernels' has no attribute {name!r}")


__all__ = ["PrepareLaunch", "ERR_SEQ_LEN", "ERR_PAGE_ID", "ERR_GRID"]
