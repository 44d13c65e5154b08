#!/usr/bin/env python3
"""docs/FORMATS.md's table rows stay one line of at most 120 characters: a row says type, default
and meaning; what needs more goes to a Semantics paragraph under its table.
Usage: formats_rows.py <project root>"""
import pathlib
import sys

LIMIT = 120
path = pathlib.Path(sys.argv[1]) / "docs/FORMATS.md"
long_rows = [(n, len(line)) for n, line in enumerate(path.read_text().splitlines(), 1)
             if line.startswith("|") and len(line) > LIMIT]
for n, length in long_rows:
    print(f"docs/FORMATS.md:{n}: a table row of {length} characters (at most {LIMIT})")
sys.exit(1 if long_rows else 0)
