"""The `graphrt` command: subcommands dispatch to their packages (`graphrt serve ...`)."""
from __future__ import annotations

import sys

COMMANDS = {"serve": "OpenAI-compatible HTTP server (graphrt.serve)"}


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {k:8s} {v}" for k, v in COMMANDS.items()]
        print("usage: graphrt <command> [options]\n\ncommands:\n" + "\n".join(lines),
              file=sys.stdout if argv and argv[0] in ("-h", "--help") else sys.stderr)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    if argv[0] == "serve":
        from graphrt.serve.cli import main as serve_main
        serve_main(argv[1:], prog="graphrt serve")


if __name__ == "__main__":
    main()
