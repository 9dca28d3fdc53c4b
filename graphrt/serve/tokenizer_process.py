"""Long prompt texts are tokenized in a separate process, so one huge prompt cannot stall the server.

What runs where:
- event loop: `takes(text)` (a length test) decides; `encode` hands the text to the process thread
  and awaits its reply.
- the process thread (one, "graphrt-serve-tokenizer"): starts the process when needed, sends it
  one text at a time over a socket pair and blocks on the reply (the GIL is released while it waits).
- the tokenizer process (started on the first long text, then reused; `serve`): a fresh
  interpreter (`python -c`, importing only this module: not the server's main script, which a
  multiprocessing spawn would run again) talking over a socket pair, with its own copy of the
  server's `tokenizers` backend (its tokenizer.json as `to_str()` gives it when the process starts:
  the vocabulary with its added tokens). It encodes through `backend_encoding` of
  graphrt/checkpoint/tokenizer.py, so the ids are identical, and replies with the ids as
  little-endian uint32 bytes, or, when their count exceeds the caller's limit, with the count
  alone: a 4 MB text's 3.2M ids never cross back. Freeing that encoding happens there too.

Why: the backend releases the GIL while it encodes, but building the ids' list and freeing the
Rust Encoding hold it (~0.3 s for a 4 MB text, ~15 ms at MIN_CHARS on a 2-core CPU), stalling the
engine's thread and every stream. Shorter texts stay in-process on the worker pool (completions.py):
no socket, no process. Only graphrt's own Tokenizer is served here (its encode is the backend's
call); another tokenizer (transformers' AutoTokenizer) keeps the in-process path for every text.

A process that dies or cannot start fails only the request it was serving (TokenizerProcessError);
the next long text starts a new one. `close` (the server's shut-down) kills it.
"""
from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from graphrt.checkpoint.tokenizer import Tokenizer, backend_encoding

# Texts of this many characters or more go to the process. Below it the in-process GIL-held tail
# (the ids' list and the Encoding's free, ~60 ns a token) is at most ~15 ms (~200k tokens of English;
# measured on a 2-core CPU): under one engine step there, while such texts keep tokenizing in
# parallel on the worker pool and never wait behind a long text in the one process.
MIN_CHARS = 256 * 1024
IDS_DTYPE = "<u4"                               # the ids on the socket: tokenizers' ids are u32
# the process's program: this graphrt (the directory above the package first on sys.path), `serve`
# on the socket's inherited descriptor
_PROGRAM = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from graphrt.serve.tokenizer_process import serve; serve(int(sys.argv[2]))")
_ROOT = str(Path(__file__).resolve().parents[2])


class TokenizerProcessError(RuntimeError):
    """The tokenizer process ended (killed, crashed) or could not start while serving a text."""


class TokenizerRefused(Exception):
    """The tokenizer raised on the text in the process: `kind` is its exception's type name,
    `message` its text (the in-process path reports the same two)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


class TokenizerProcess:
    """tokenizer: the server's tokenizer; texts of min_chars characters or more (`takes`) are
    tokenized in the process, whose backend is a copy of tokenizer.backend_tokenizer."""

    def __init__(self, tokenizer, *, min_chars: int = MIN_CHARS):
        if isinstance(min_chars, bool) or not isinstance(min_chars, int) or min_chars < 1:
            raise ValueError(f"min_chars: must be an int >= 1, got {min_chars!r}")
        self.min_chars = min_chars
        self._backend = tokenizer.backend_tokenizer if isinstance(tokenizer, Tokenizer) else None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graphrt-serve-tokenizer")
        self._lock = threading.Lock()          # _proc, _conn, _closed: the process thread and close()
        self._one = threading.Lock()           # one text at a time on the socket, whichever thread asks
        self._proc = self._conn = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The running process's id (None before the first long text or after it ended)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def takes(self, text: str) -> bool:
        """Whether `text` is tokenized in the process (event loop; O(1))."""
        return self._backend is not None and len(text) >= self.min_chars and not self._closed

    async def encode(self, text: str, *, add_special_tokens: bool, limit: int | None) -> tuple[int, list[int] | None]:
        """(the text's token count, its ids; None when the count exceeds `limit`). Raises
        TokenizerRefused (the tokenizer raised on the text) or TokenizerProcessError."""
        fut = self._thread.submit(self.encode_blocking, text, add_special_tokens, limit)
        return await asyncio.wrap_future(fut)

    def encode_blocking(self, text: str, add_special_tokens: bool, limit: int | None) -> tuple[int, list[int] | None]:
        """`encode` on the calling thread, blocking (`encode` runs it on the process thread); texts
        from several threads take turns."""
        with self._one:
            conn, first = self._start()
            try:
                if first is not None:
                    conn.send_bytes(first)
                conn.send((text, add_special_tokens, limit))
                reply = conn.recv()
            except (EOFError, OSError):
                code = self._reap(conn)
                raise TokenizerProcessError(f"the tokenizer process ended (exit code {code}) while tokenizing a "
                                            f"text of {len(text)} characters; the next one starts a new "
                                            f"process") from None
        if reply[0] == "count":
            return reply[1], None
        if reply[0] == "ids":
            return reply[1], np.frombuffer(reply[2], dtype=IDS_DTYPE).tolist()
        raise TokenizerRefused(reply[1], reply[2])

    def close(self) -> None:
        """Kill the process and end the process thread (the server's shut-down; idempotent)."""
        with self._lock:
            self._closed = True
            proc, conn = self._proc, self._conn
            self._proc = self._conn = None
        if proc is not None:
            _end(proc)                          # a text being tokenized: its request fails
            conn.close()
        self._thread.shutdown(wait=True, cancel_futures=True)

    # ---- the process --------------------------------------------------------------------------------
    def _start(self) -> tuple[Connection, bytes | None]:
        """(the live process's connection, None), or, when none runs, a new process's and the
        tokenizer.json to send it first (process thread)."""
        with self._lock:
            if self._closed:
                raise TokenizerProcessError("the server is shutting down")
            if self._proc is not None:
                if self._proc.poll() is None:
                    return self._conn, None
                self._conn.close()              # it ended between texts
                self._proc = self._conn = None
            try:
                spec = self._backend.to_str().encode()
            except Exception as e:              # not serializable: long texts stay in the server from now on
                self._backend = None
                raise TokenizerProcessError(f"the tokenizer cannot be copied to a process ({type(e).__name__}: "
                                            f"{e}); long texts are tokenized in the server from now on") from None
            ours, theirs = socket.socketpair()
            try:
                proc = subprocess.Popen([sys.executable, "-c", _PROGRAM, _ROOT, str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
            except OSError as e:
                ours.close()
                raise TokenizerProcessError(f"the tokenizer process could not start: {type(e).__name__}: {e}") from None
            finally:
                theirs.close()                  # the process's copy alone: its exit ends our reads
            self._proc, self._conn = proc, Connection(ours.detach())
            return self._conn, spec

    def _reap(self, conn) -> int | None:
        """Forget the process behind `conn` after its pipe failed -> its exit code (None: unknown)."""
        with self._lock:
            proc = self._proc if self._conn is conn else None
            if proc is not None:
                self._proc = self._conn = None
        if proc is None:                        # close() took it
            return None
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:       # the pipe failed but the process lives on: end it
            _end(proc)
        conn.close()
        return proc.returncode


def _end(proc: subprocess.Popen) -> None:
    """Kill the process and reap it (a few seconds at most)."""
    proc.kill()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def serve(fd: int) -> None:
    """The tokenizer process's loop on socket descriptor `fd`: the backend's tokenizer.json first
    (bytes); then (text, add_special_tokens, limit) in, ("ids", count, uint32 bytes), ("count",
    count) past the limit, or ("refused", type name, message) out. Ends when the server's end closes."""
    from tokenizers import Tokenizer as Backend
    conn = Connection(fd)
    try:
        backend = Backend.from_str(conn.recv_bytes().decode())
    except EOFError:
        return
    while True:
        try:
            text, add_special_tokens, limit = conn.recv()
        except EOFError:
            return
        try:
            enc = backend_encoding(backend, text, add_special_tokens)
        except Exception as e:                  # what the in-process call raises too
            conn.send(("refused", type(e).__name__, str(e)))
            continue
        n = len(enc)
        if limit is not None and n > limit:
            conn.send(("count", n))
        else:
            conn.send(("ids", n, np.asarray(enc.ids, dtype=IDS_DTYPE).tobytes()))
        del enc                                 # freed here, not in the server


__all__ = ["MIN_CHARS", "TokenizerProcess", "TokenizerProcessError", "TokenizerRefused", "serve"]
