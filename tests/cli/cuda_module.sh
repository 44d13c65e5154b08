#!/usr/bin/env bash
# The CUDA backend is a module loaded on first use (exec/src/cuda/cuda_module.hpp): the sextant
# executable must not link the CUDA libraries (their initialisers made every command start in
# ~0.4 s), `run --backend cuda` must find the module, and a module that cannot be loaded must be
# named in a clear error, not a crash.
# Usage: cuda_module.sh SEXTANT MODULE_OR_EMPTY
set -u
sextant="$1"
module="${2:-}"
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

needed=$(readelf -d "$sextant" | grep NEEDED)
for lib in libcudart libcublas libcublasLt libnccl; do
  grep -q "$lib" <<<"$needed" && fail "$sextant links $lib eagerly: $needed"
done

if [ -z "$module" ]; then
  echo "built without CUDA: the module checks do not apply"
  [ "$failures" -eq 0 ] || exit 1
  exit 0
fi
[ -f "$module" ] || fail "the module $module was not built"
readelf -d "$module" | grep NEEDED | grep -q libcublas || fail "$module does not link cuBLAS"
exported=$(nm -D --defined-only "$module" | awk '$2 == "T" {print $3}')
[ "$exported" = "sextant_cuda_module" ] || fail "the module exports more than its entry: $exported"

run=(run --model gpt-tiny --backend cuda --steps 1 --global-batch 2 --micro-batch 2 --quiet)
# Found beside nothing but the build tree: either a GPU runs the step, or the CUDA runtime (not
# the loader) says why there is none.
out=$(timeout 120 "$sextant" "${run[@]}" 2>&1)
grep -q "could not be loaded" <<<"$out" && fail "the module was not found from the build tree: $out"

out=$(SEXTANT_CUDA_MODULE=/nonexistent/libsextant_cuda.so timeout 60 "$sextant" "${run[@]}" 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "absent module: exit $rc, want 2: $out"
grep -q "/nonexistent/libsextant_cuda.so (absent)" <<<"$out" || fail "absent module message: $out"

# Not a shared object at all: dlopen's reason is passed on.
out=$(SEXTANT_CUDA_MODULE="$0" timeout 60 "$sextant" "${run[@]}" 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "bad module: exit $rc, want 2: $out"
grep -q "could not be loaded (tried $0 (" <<<"$out" || fail "bad module message: $out"

# A copy of the executable elsewhere still finds the module of its build.
copy=$(mktemp -d)
cp "$sextant" "$copy/sextant"
out=$(timeout 120 "$copy/sextant" "${run[@]}" 2>&1)
grep -q "could not be loaded" <<<"$out" && fail "a copied executable lost the module: $out"
rm -rf "$copy"

[ "$failures" -eq 0 ] || exit 1
echo "cuda module: ok"
