"""LLM() ready time from process start, split: interpreter start, `import torch`, `import graphrt`,
LLM(); argv: checkpoint, the shell's start time (date +%s.%N), mode ("plain" | "bg": transformers
imported on a thread from the start)."""
import sys
import time

t_py = time.time()
t_shell = float(sys.argv[2])
import threading

if sys.argv[3] == "bg":
    threading.Thread(target=lambda: __import__("transformers.models.auto.tokenization_auto"), daemon=True).start()
import torch  # noqa: E402

t_torch = time.time()
import graphrt  # noqa: E402

t_graphrt = time.time()
import logging  # noqa: E402

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
llm = graphrt.LLM(sys.argv[1], max_batch=16, max_model_len=8192)
t_ready = time.time()
print(f"ready {t_ready - t_shell:.2f} s after process start ({sys.argv[3]}): interpreter {t_py - t_shell:.2f}, "
      f"import torch {t_torch - t_py:.2f}, import graphrt {t_graphrt - t_torch:.2f}, LLM() {t_ready - t_graphrt:.2f}")
llm.shutdown()
