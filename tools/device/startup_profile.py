"""Where a warm start's seconds go: serve's load path with --graph-cache (as serve_load.py) under
cProfile; argv: checkpoint, cache directory, the shell's start time (date +%s.%N), output prefix.
Prints the ready time from process start and the seconds before the first line of the script;
writes PREFIX.cum.txt / PREFIX.tot.txt (the 60 heaviest functions by cumulative / own time).
Run under `python -X importtime` (stderr) for the imports."""
import sys
import time

t_start, t_py = float(sys.argv[3]), time.time()
import cProfile  # noqa: E402
import io  # noqa: E402
import logging  # noqa: E402
import pstats  # noqa: E402

logging.basicConfig(level=logging.INFO, format="%(relativeCreated)6d %(name)s: %(message)s")
prof = cProfile.Profile()
prof.enable()
from graphrt.serve.cli import build_parser, load  # noqa: E402

t_import = time.time()
a = build_parser().parse_args(["--model", sys.argv[1], "--graph-cache", sys.argv[2], "--max-num-seqs", "16",
                               "--max-model-len", "8192", "--stats-interval", "0"])
llm, _ = load(a)
prof.disable()
t_ready = time.time()
print(f"ready {t_ready - t_start:.2f} s after process start: interpreter {t_py - t_start:.2f}, "
      f"import graphrt.serve.cli {t_import - t_py:.2f}, load {t_ready - t_import:.2f}")
for key, suffix in (("cumulative", "cum"), ("tottime", "tot")):
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(60)
    open(f"{sys.argv[4]}.{suffix}.txt", "w").write(buf.getvalue())
llm.shutdown()
