"""`python -m graphrt.serve ...` = `graphrt serve ...`."""
from .cli import main

main()
