#!/usr/bin/env bash
# `sextant validate`'s CI bounds: a bound no table meets exits 1 and names each table (mean) and
# each row (row bound) it misses; bounds every table meets exit 0; the untimed tables (T5d's
# memory, the K traces) are never held to them.
set -euo pipefail
sextant="$1"
out="$2"
mkdir -p "$out"

rc=0
"$sextant" validate --max-mean-error 0.001 --max-row-error 0.001 >"$out/tight.txt" \
  2>"$out/tight.err" || rc=$?
[[ $rc -eq 1 ]] || { echo "tight bounds: expected exit 1, got $rc"; exit 1; }
for table in T1 T4 T5 T6 T9; do
  grep -q "^$table: mean absolute error [0-9.]*% is above the allowed 0.1%" "$out/tight.err" ||
    { echo "no mean-bound miss for $table"; cat "$out/tight.err"; exit 1; }
  grep -q "^$table .*: error -\?[0-9.]*% is above the allowed 0.1% for a row" "$out/tight.err" ||
    { echo "no row-bound miss for $table"; cat "$out/tight.err"; exit 1; }
done
if grep -q "^\(T5d\|K[0-9]\)" "$out/tight.err"; then
  echo "an untimed table was held to the bounds"
  cat "$out/tight.err"
  exit 1
fi

"$sextant" validate --max-mean-error 1 --max-row-error 1 >"$out/loose.txt" 2>"$out/loose.err" ||
  { echo "loose bounds: expected exit 0"; cat "$out/loose.err"; exit 1; }
[[ ! -s "$out/loose.err" ]] || { echo "loose bounds printed misses"; cat "$out/loose.err"; exit 1; }
echo "validate bounds: ok"
