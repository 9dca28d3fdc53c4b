"""The decode step as one persistent Triton kernel (schedule.py: the static work units and their
counters; sync.py: the counters' wait / signal; gemv_tile.py, units.py: the unit bodies;
step.py: the kernel and its launcher, `PersistentStep`)."""
from graphrt.kernels.persistent.schedule import Geometry, Schedule, Tiles, build_schedule, simulate
from graphrt.kernels.persistent.step import PersistentStep, unsupported
from graphrt.kernels.persistent.sync import ERR_STALL

__all__ = ["Geometry", "Schedule", "Tiles", "build_schedule", "simulate", "PersistentStep", "unsupported",
           "ERR_STALL"]
