"""ServeConfig (what the HTTP layer adds to the engine) and the `--config` YAML file.

The YAML file is one flat mapping: EngineConfig fields (max_batch or its vLLM name max_num_seqs,
steps_per_graph ("auto" or K), page_size, num_pages, gpu_memory_utilization, max_model_len, backend, dtype,
overlap, capture, seed, kv_cache_dtype) and ServeConfig fields (served_model_name, max_waiting, max_request_bytes,
api_key, chat_template: a file or the Jinja text, header_timeout_s, body_timeout_s,
max_connections, shutdown_timeout_s). An unknown key is an error naming it; invalid YAML is one
line naming the file, line and column. Flags given on the command line win.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from graphrt.serve.limits import DEFAULT_MAX_REQUEST_BYTES

DEFAULT_MAX_WAITING = 64
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """served_model_name: the `model` clients must send (None: the --model argument as given);
    max_waiting: engine sequences (each prompt's n or best_of samples) that may queue beyond the
    engine's decode slots before 503;
    max_request_bytes: a larger request body is refused with 413 before it is parsed;
    api_key: when set, every endpoint but /health needs `Authorization: Bearer <api_key>` (401
    otherwise, auth.py); chat_template: Jinja text that replaces the tokenizer's chat template;
    header_timeout_s: a request's headers must arrive within this many seconds of the connection's
    start (on a kept-alive connection: of the request's first byte), else 408 and the connection
    is closed;
    body_timeout_s: its body must arrive whole within this many seconds of its headers, else 408;
    max_connections: open connections; one more is answered 503 and closed at once;
    shutdown_timeout_s: on SIGTERM in-flight streams end with an error event at once and the
    server exits within this many seconds (requests still arriving are cancelled then)."""

    served_model_name: str | None = None
    max_waiting: int = DEFAULT_MAX_WAITING
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    api_key: str | None = field(default=None, repr=False)   # a secret: not in logs
    chat_template: str | None = None
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S

    def __post_init__(self):
        for name in ("header_timeout_s", "body_timeout_s", "shutdown_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 86400:
                raise ValueError(f"{name}: must be a number of seconds in (0, 86400], got {v!r}")
        mc = self.max_connections
        if isinstance(mc, bool) or not isinstance(mc, int) or mc < 1:
            raise ValueError(f"max_connections: must be an int >= 1, got {mc!r}")
        if isinstance(self.max_waiting, bool) or not isinstance(self.max_waiting, int) or self.max_waiting < 0:
            raise ValueError(f"max_waiting: must be an int >= 0, got {self.max_waiting!r}")
        mb = self.max_request_bytes
        if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
            raise ValueError(f"max_request_bytes: must be an int >= 1, got {mb!r}")
        name = self.served_model_name
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"served_model_name: expected a non-empty string, got {name!r}")
        for key in ("api_key", "chat_template"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                got = "an empty one" if isinstance(v, str) else type(v).__name__   # never echo the key
                raise ValueError(f"{key}: expected a non-empty string, got {got}")


def load_serve_yaml(path: str | Path, engine_fields: tuple[str, ...]) -> tuple[dict, dict]:
    """-> (EngineConfig kwargs, ServeConfig kwargs) from the flat YAML mapping at `path`."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--config: no such file {str(path)!r}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ValueError(f"{path}: invalid YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    serve_fields = tuple(f.name for f in dataclasses.fields(ServeConfig))
    engine_fields = tuple(engine_fields) + ("max_num_seqs",) * ("max_batch" in engine_fields)   # vLLM's name
    unknown = sorted(set(data) - set(engine_fields) - set(serve_fields))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(engine_fields + serve_fields)}")
    return ({k: v for k, v in data.items() if k in engine_fields},
            {k: v for k, v in data.items() if k in serve_fields})


__all__ = ["ServeConfig", "load_serve_yaml", "DEFAULT_MAX_WAITING", "DEFAULT_HEADER_TIMEOUT_S",
           "DEFAULT_BODY_TIMEOUT_S", "DEFAULT_MAX_CONNECTIONS", "DEFAULT_SHUTDOWN_TIMEOUT_S"]
