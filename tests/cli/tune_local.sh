#!/usr/bin/env bash
# `sextant tune` on this machine's CPU ranks: each trial runs between core checks, as the loop's
# runs do (loop/rounds.hpp), against the fastest core times seen, kept in the tune's directory
# (cores.json); a resumed tune keeps that reference and reruns nothing. No time is asserted:
# --quiet-wait 0 keeps a busy machine from waiting, its runs are kept and marked.
set -u
sextant="$1"
source "$(dirname "$0")/probe_lib.sh"
tune=(tune --model gpt-tiny --cluster local-cpu --gpus 2 --global-batch 8 --candidates 2
  --max-trials 2 --steps 3 --quiet-wait 0 --dir "$dir/tune" --json)
timeout 300 "$sextant" "${tune[@]}" >"$dir/first.json" 2>"$dir/first.err" ||
  fail "tune: $(tail -5 "$dir/first.err")"
[ -s "$dir/tune/cores.json" ] || fail "no core reference in the tune's directory"
python3 - "$dir/first.json" <<'PY' || fail "the tune's report"
import json, sys
r = json.load(open(sys.argv[1]))
assert 1 <= len(r["trials"]) <= 2, r["trials"]
assert all(t["status"] == "ok" and t["measured_s"] > 0 for t in r["trials"]), r["trials"]
PY
before=$(stat -c %Y "$dir/tune/cores.json" 2>/dev/null)
timeout 300 "$sextant" "${tune[@]}" >"$dir/second.json" 2>"$dir/second.err" ||
  fail "resumed tune: $(tail -5 "$dir/second.err")"
python3 - "$dir/first.json" "$dir/second.json" <<'PY' || fail "the resumed tune's report"
import json, sys
first, second = (json.load(open(f)) for f in sys.argv[1:3])
assert second["resumed_trials"] == len(first["trials"]), second
PY
[ "$(stat -c %Y "$dir/tune/cores.json" 2>/dev/null)" = "$before" ] ||
  fail "the resumed tune replaced its core reference"
[ "$failures" -eq 0 ] && echo "tune_local: ok"
exit $((failures > 0))
