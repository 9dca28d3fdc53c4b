"""A warm start through graphrt serve's load path with --graph-cache; argv: checkpoint, cache
directory, the shell's start time (date +%s.%N). Prints the ready time from process start."""
import sys
import time

t_start = float(sys.argv[3])
import logging  # noqa: E402

logging.basicConfig(level=logging.INFO, format="%(relativeCreated)6d %(name)s: %(message)s")
from graphrt.serve.cli import build_parser, load  # noqa: E402

a = build_parser().parse_args(["--model", sys.argv[1], "--graph-cache", sys.argv[2], "--max-num-seqs", "16",
                               "--max-model-len", "8192", "--stats-interval", "0"])
llm, _ = load(a)
print(f"ready {time.time() - t_start:.2f} s after process start")
llm.shutdown()
