#!/usr/bin/env bash
# Runs a benchmark and records its output in bench/results/<name>.md with the date, the machine
# and the commit. Usage: bench/run.sh <name> <command...>
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="$1"
shift
mkdir -p "$root/bench/results"
out="$root/bench/results/$name.md"
commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | head -1)
[ -n "$dirty" ] && commit="$commit-dirty"
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
# The name alone ("AMD EPYC") hides which generation ran: CPU family 25 is Zen 3/4, 26 Zen 5, and
# the same benchmark differed by 1.5x between them. Record family, model and clock too.
family=$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
model=$(grep -m1 -P '^model\t' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
mhz=$(grep -m1 'cpu MHz' /proc/cpuinfo | cut -d: -f2 | tr -d ' ' | cut -d. -f1)
cpu="$cpu (CPU family ${family:-?} model ${model:-?}, ${mhz:-?} MHz)"
log=$(mktemp)
"$@" | tee "$log"
{
  echo "# $name"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- machine: $(nproc) cores, $cpu, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- commit: $commit"
  echo "- command: \`$*\`"
  echo
  echo '```'
  cat "$log"
  echo '```'
} >"$out"
rm -f "$log"
echo "recorded in ${out#$root/}"
