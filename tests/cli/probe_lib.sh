# Shared by the command-line probes (bad_inputs.sh, trust_probe.sh): a scratch directory removed at
# exit, a failure count, and expect_error. Source it after setting `sextant`.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

expect_error() {  # expect_error <substring> <command...>: exit 2 with the substring in the output
  local want="$1"
  shift
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 2 ]; then
    echo "FAIL (exit $rc, want 2): $*"
    echo "$out" | head -5
    failures=$((failures + 1))
  elif ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL (message lacks '$want'): $*"
    echo "$out" | head -5
    failures=$((failures + 1))
  fi
}
