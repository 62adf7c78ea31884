#!/bin/sh
# Builds into one folder (default gpu-artifacts/, ignored by git, about 35 MiB) everything scripts/gpu-check.sh
# needs on a bare GPU machine without Go: libucp.so built with -tags cuda (CUDA and NCCL headers from
# scripts/cuda-check.sh's cache; it links neither, both are opened at run time), the internal/load test binary
# built with -tags cuda (the Go-only check, run where torch is absent), and static ucp and benchgen binaries
# that generate the multi-GB checkpoint there (only 64 MiB travel to the GPU machine).
set -eu
GO=${GO:-go}
OUT=${1:-gpu-artifacts}
CACHE=${UCP_CUDA_CACHE:-/var/cache/ucp/cuda}
[ -f "$CACHE/complete" ] || GO=$GO ./scripts/cuda-check.sh
export CGO_CFLAGS="-I$CACHE/root/usr/include"
rm -rf "$OUT.partial" && mkdir -p "$OUT.partial"
CGO_ENABLED=0 $GO build -trimpath -ldflags="-s -w" -o "$OUT.partial/ucp" ./cmd/ucp
CGO_ENABLED=0 $GO build -trimpath -ldflags="-s -w" -o "$OUT.partial/benchgen" ./internal/cmd/benchgen
$GO build -trimpath -ldflags="-s -w" -tags cuda -buildmode=c-shared -o "$OUT.partial/libucp.so" ./capi
$GO test -trimpath -ldflags="-s -w" -tags cuda -c -o "$OUT.partial/load.test" ./internal/load/
rm -f "$OUT.partial/libucp.h"
git rev-parse HEAD >"$OUT.partial/COMMIT" 2>/dev/null || true
rm -rf "$OUT" && mv "$OUT.partial" "$OUT"
du -sh "$OUT"
ls -l "$OUT"
