#!/usr/bin/env bash
# Runs the command examples of README.md and docs/USAGE.md as printed (the newcomer path after
# scripts/demo.sh): every `sextant ...` and `mpirun ... sextant ...` line of their code blocks,
# continuation lines joined, from a scratch directory with the repository's files at hand.
# Synopses with [optional] parts, placeholder paths, the CUDA examples (no GPU here) and the long
# `loop` are left out and counted.
# Not part of ctest: the large plans take minutes. Usage: scripts/readme_examples.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sextant="$root/build/release/cli/sextant"
[ -x "$sextant" ] || { echo "build first (scripts/build.sh)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
ln -s "$root/tests" tests
ln -s "$root/clusters" clusters
ln -s "$root/traces" traces
mpirun_flags="--oversubscribe$([ "$(id -u)" -eq 0 ] && echo ' --allow-run-as-root')"
ran=0 skipped=0 failed=0
while IFS= read -r cmd; do
  if [[ "$cmd" == *"["* || "$cmd" == *"path/to"* || "$cmd" == *"--backend cuda"* ||
        "$cmd" == *"profile.json"* || "$cmd" == *"best-plan.json"* || "$cmd" == *"comm.json"* ||
        "$cmd" == *"measured.json"* || "$cmd" == "sextant loop"* ]]; then
    skipped=$((skipped + 1))
    continue
  fi
  line=${cmd%%#*}  # a trailing comment
  line=${line// --oversubscribe/}
  line=${line//mpirun -np/mpirun $mpirun_flags -np}
  # The command word only (the line's first, or mpirun's program), not a `--stack sextant` value.
  line=${line/#sextant /$sextant }
  line=${line// sextant run / $sextant run }
  ran=$((ran + 1))
  start=$(date +%s)
  if out=$(timeout 900 bash -c "$line" </dev/null 2>&1); then  # mpirun reads stdin
    printf 'ok   %4ss  %s\n' $(( $(date +%s) - start )) "${cmd:0:80}"
  else
    failed=$((failed + 1))
    printf 'FAIL %4ss  %s\n' $(( $(date +%s) - start )) "$cmd"
    tail -3 <<<"$out" | sed 's/^/       /'
  fi
done < <(awk '/^```/ { block = !block; next }
              block { if (cont != "") { sub(/^ +/, ""); line = cont " " $0 } else line = $0
                      if (line ~ /\\$/) { sub(/\\$/, "", line); cont = line; next }
                      cont = ""
                      if (line ~ /^(sextant|mpirun) /) print line }' "$root/README.md" "$root/docs/USAGE.md")
echo "README and USAGE examples: $ran run, $failed failed, $skipped synopses or GPU/placeholder lines left out"
[ "$failed" -eq 0 ]
