"""ServeConfig (what the HTTP layer adds to the engine) and the `--config` YAML file.

The YAML file is one flat mapping: EngineConfig fields (max_batch, steps_per_graph, page_size,
num_pages, max_model_len, backend, dtype, overlap, capture, seed) and ServeConfig fields
(served_model_name, max_waiting). An unknown key is an error naming it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

DEFAULT_MAX_WAITING = 64


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """served_model_name: the `model` clients must send (None: the --model argument as given);
    max_waiting: requests that may queue beyond the engine's decode slots before 503."""

    served_model_name: str | None = None
    max_waiting: int = DEFAULT_MAX_WAITING

    def __post_init__(self):
        if isinstance(self.max_waiting, bool) or not isinstance(self.max_waiting, int) or self.max_waiting < 0:
            raise ValueError(f"max_waiting: must be an int >= 0, got {self.max_waiting!r}")
        name = self.served_model_name
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"served_model_name: expected a non-empty string, got {name!r}")


def load_serve_yaml(path: str | Path, engine_fields: tuple[str, ...]) -> tuple[dict, dict]:
    """-> (EngineConfig kwargs, ServeConfig kwargs) from the flat YAML mapping at `path`."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--config: no such file {str(path)!r}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    serve_fields = tuple(f.name for f in dataclasses.fields(ServeConfig))
    unknown = sorted(set(data) - set(engine_fields) - set(serve_fields))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(engine_fields + serve_fields)}")
    return ({k: v for k, v in data.items() if k in engine_fields},
            {k: v for k, v in data.items() if k in serve_fields})


__all__ = ["ServeConfig", "load_serve_yaml", "DEFAULT_MAX_WAITING"]
