"""The decode step as one persistent Triton kernel (schedule.py: the static work units and their
counters; sync.py: the counters' wait / signal; units.py with gemv_tile.py (weights in
registers) or gemv_ring.py (a shared-memory ring): the unit bodies; formats.py: the weight
formats the GEMV tile takes, model dtype, FP8 or int4; step.py: the kernel and its launcher,
`PersistentStep`). The schedule and the formats are host code (no Triton);
the kernel modules load on first use of their names, so importing the package imports no Triton."""
from graphrt.kernels.flags import ERR_STALL
from graphrt.kernels.persistent.schedule import Geometry, Schedule, Tiles, build_schedule, simulate


def __getattr__(name):
    if name in ("PersistentStep", "unsupported"):
        from graphrt.kernels.persistent import step
        return getattr(step, name)
    raise AttributeError(f"module 'graphrt.kernels.persistent' has no attribute {name!r}")


__all__ = ["Geometry", "Schedule", "Tiles", "build_schedule", "simulate", "PersistentStep", "unsupported",
           "ERR_STALL"]
