"""`python -m graphrt.serve ...` = `graphrt serve ...`."""
from graphrt.serve.cli import main

main()
