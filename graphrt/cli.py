"""The `graphrt` command: subcommands dispatch to their packages (`graphrt serve ...`).

    graphrt serve MODEL ...     # MODEL: DIR or ORG/NAME; graphrt/serve/cli.py
    graphrt --version
"""
from __future__ import annotations

import sys

COMMANDS = {"serve": "OpenAI-compatible HTTP server (graphrt.serve)"}
USAGE = "usage: graphrt [-h] [--version] <command> [options]"


def _help() -> str:
    lines = [f"  {k:8s} {v}" for k, v in COMMANDS.items()]
    return (f"{USAGE}\n\ncommands:\n" + "\n".join(lines) +
            "\n\noptions:\n  -h, --help  show this help and exit\n  --version   print graphrt's version and exit\n"
            "\n'graphrt <command> --help' shows a command's options.")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(_help())
        raise SystemExit(0)
    if argv and argv[0] == "--version":
        from graphrt import __version__
        print(f"graphrt {__version__}")
        raise SystemExit(0)
    if not argv:
        print(f"{_help()}\ngraphrt: error: a command is required", file=sys.stderr)
        raise SystemExit(2)
    if argv[0] not in COMMANDS:
        what = "option" if argv[0].startswith("-") else "command"
        print(f"{USAGE}\ngraphrt: error: unknown {what} {argv[0]!r} (commands: {', '.join(COMMANDS)}; "
              f"see graphrt --help)", file=sys.stderr)
        raise SystemExit(2)
    if argv[0] == "serve":
        from graphrt.serve.cli import main as serve_main
        serve_main(argv[1:], prog="graphrt serve")


if __name__ == "__main__":
    main()
