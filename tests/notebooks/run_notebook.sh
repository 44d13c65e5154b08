#!/usr/bin/env bash
# Executes a notebook headless with Debian's Jupyter (nbconvert), so that it cannot silently rot.
# Usage: run_notebook.sh <notebook> <sextant binary>
set -euo pipefail
notebook="$1"
export SEXTANT_BIN="$2"
export SEXTANT_ROOT="$(cd "$(dirname "$notebook")/.." && pwd)"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export SEXTANT_FIGURE="$out/figure.png"
# Debian's jupyter runs on /usr/bin/python3, which has matplotlib and pandas.
/usr/bin/jupyter-nbconvert --to notebook --execute --ExecutePreprocessor.timeout=600 \
  --output-dir "$out" "$notebook" >/dev/null 2>"$out/log" || { cat "$out/log"; exit 1; }
test -s "$SEXTANT_FIGURE" || { echo "the notebook wrote no figure"; exit 1; }
echo "executed $(basename "$notebook")"
