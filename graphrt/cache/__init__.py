"""Graph caches: the on-disk kernel/JIT cache a warm start loads, and its trust model.

Entry points: `load.py` (open / build / check a cache directory), `manifest.py` (what a cache
records and the environment it must match), `files.py` (hashing and file-safety checks).
"""
