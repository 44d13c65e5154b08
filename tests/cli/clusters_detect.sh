#!/usr/bin/env bash
# `sextant clusters detect`: a file for this machine's CPU that reads back, says which CPU it was
# made for and how many cores it has, and holds the co-run slowdown; `sextant loop` refuses a file
# made for another CPU, naming both CPUs and the way out. No timing is asserted: the rates are the
# machine's.
set -uo pipefail
sextant="$1"
source "$(dirname "$0")/probe_lib.sh"

"$sextant" clusters detect --out "$dir/cpu.json" >"$dir/detect.txt" 2>&1 || fail "detect: $(cat "$dir/detect.txt")"
python3 - "$dir/cpu.json" "$(nproc)" <<'PY' || fail "detected file"
import json, sys
d = json.load(open(sys.argv[1]))
dev = d["device"]
here = open("/proc/cpuinfo").read().split("\n\n")[0]
fields = dict((k.strip(), v.strip()) for k, _, v in (l.partition(":") for l in here.splitlines()))
want = f'{fields["vendor_id"]} family {fields["cpu family"]} model {fields["model"]}'
assert dev["host_cpu"].startswith(want + ": "), (dev["host_cpu"], want)
assert d["devices_per_node"] == int(sys.argv[2]), d["devices_per_node"]
assert dev["kind"] == "cpu" and dev["peak_tflops"]["fp32"] > 0
assert all(0 < p["efficiency"] <= 1 for p in dev["gemm_efficiency"]), dev["gemm_efficiency"]
assert "flash2" in dev["attention_kernels"], dev.keys()
if d["devices_per_node"] >= 2:
    assert 1 <= dev["co_run"]["matrix"] <= 10 and dev["co_run"]["devices"] == d["devices_per_node"]
    # The bandwidth is at least the co-run probe's streaming add alone: three 256 KiB arrays, 400
    # passes (314,572,800 bytes) in the time its source states to the microsecond.
    import re
    alone_ms = float(re.search(r"streaming add ([0-9.]+) ms alone", dev["co_run"]["source"])[1])
    stream_GBps = 3 * 65536 * 4 * 400 / (alone_ms * 1e-3) / 1e9
    assert dev["memory_bandwidth_GBps"] >= stream_GBps * (1 - 0.001 / alone_ms) - 1e-9, \
        (dev["memory_bandwidth_GBps"], stream_GBps)
assert dev["peak_measured"] is True, dev.keys()
PY
# Three training runs, the fastest kept (their traces beside the file).
for i in 1 2 3; do
  [ -s "$dir/detect-gpt-tiny.$i.measured.json" ] || fail "no training run $i of clusters detect"
done
# (Into a file first: `grep -q` leaving a pipe early would kill the writer, a failure under
# pipefail that depends on timing.)
"$sextant" clusters show "$dir/cpu.json" --wide >"$dir/show.txt" 2>&1
grep -q "made for: " "$dir/show.txt" || fail "clusters show names no CPU: $(head -5 "$dir/show.txt")"
"$sextant" simulate --model gpt-tiny --cluster "$dir/cpu.json" --dp 2 --global-batch 16 \
  --micro-batch 4 >"$dir/sim.txt" 2>&1 || fail "simulate on the detected file: $(cat "$dir/sim.txt")"

# The same file said to be for another CPU: the loop will not predict this machine with it.
python3 - "$dir/cpu.json" "$dir/other.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["device"]["host_cpu"] = "NoVendor family 0 model 0: a CPU that does not exist"
json.dump(d, open(sys.argv[2], "w"))
PY
expect_error "was made for another CPU (NoVendor family 0 model 0" \
  "$sextant" loop --cluster "$dir/other.json" --out "$dir/loop"
expect_error "sextant clusters detect --out FILE" \
  "$sextant" loop --cluster "$dir/other.json" --out "$dir/loop"
expect_error "--out = /proc/nope/cpu.json" "$sextant" clusters detect --out /proc/nope/cpu.json

[ "$failures" -eq 0 ] || exit 1
echo "clusters detect: ok"
