#!/bin/sh
# Compiles and vets the cuda build of internal/load (cuda.go: the device path of the group load) and of capi
# (libucp.so), -tags cuda, against real CUDA and NCCL headers
# and libraries, without a GPU, a driver or installing anything: the Debian packages are fetched with
# `apt-get download` through a private sources list and lists folder (the system's apt set-up is not
# touched) and unpacked with dpkg-deb into a cache folder outside the repository:
#   Debian 12 non-free  nvidia-cuda-dev, libcudart11.0   cuda_runtime.h, libcudart.so (CUDA 11.8)
#   Debian 13 contrib   libnccl-dev, libnccl2            nccl.h, libnccl.so
# nvidia-cuda-dev is a 770 MB download; only its headers and libcudart.so are kept.
set -eu
GO=${GO:-go}
CACHE=${UCP_CUDA_CACHE:-/var/cache/ucp/cuda}
ROOT=$CACHE/root
LIB=$ROOT/usr/lib/x86_64-linux-gnu

if [ ! -f "$CACHE/complete" ]; then
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/ucp-cuda.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/debs"
	key=/usr/share/keyrings/debian-archive-keyring.gpg
	cat >"$tmp/sources.list" <<LIST
deb [signed-by=$key] http://deb.debian.org/debian bookworm non-free
deb [signed-by=$key] http://deb.debian.org/debian trixie contrib
LIST
	set -- -o "Dir::Etc::sourcelist=$tmp/sources.list" -o Dir::Etc::sourceparts=- \
		-o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o APT::Sandbox::User=root \
		-o DPkg::Lock::Timeout=600
	apt-get "$@" -q update
	(cd "$tmp/debs" && apt-get "$@" -q download nvidia-cuda-dev/bookworm libcudart11.0/bookworm \
		libnccl-dev/trixie libnccl2/trixie)
	rm -rf "$ROOT.partial" && mkdir -p "$ROOT.partial"
	for deb in "$tmp"/debs/*.deb; do
		# headers and shared libraries only (no static archives, docs or tools)
		dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$ROOT.partial" --wildcards --no-wildcards-match-slash \
			--exclude='*.a' './usr/include/*' './usr/lib/x86_64-linux-gnu/libcudart.so*' \
			'./usr/lib/x86_64-linux-gnu/libnccl.so*' 2>/dev/null || true
		rm -f "$deb"
	done
	for f in usr/include/cuda_runtime.h usr/include/nccl.h; do
		[ -f "$ROOT.partial/$f" ] || { echo "cuda-check: $f is missing from the downloaded packages" >&2; exit 1; }
	done
	rm -rf "$ROOT" && mv "$ROOT.partial" "$ROOT" && touch "$CACHE/complete"
fi

# Link against the unpacked libraries. Trixie's libnccl needs glibc 2.38 symbols that Debian 12's libc lacks:
# they are resolved at run time on the GPU machine, not here.
export CGO_CFLAGS="-I$ROOT/usr/include"
export CGO_LDFLAGS="-L$LIB -Wl,-rpath-link,$LIB -Wl,--allow-shlib-undefined"
echo "cuda-check: CUDA and NCCL from $ROOT"
grep -m1 '#define CUDART_VERSION' "$ROOT/usr/include/cuda_runtime_api.h"
grep -m3 -E '#define NCCL_(MAJOR|MINOR|PATCH) ' "$ROOT/usr/include/nccl.h"
$GO vet -tags cuda ./internal/load/ ./capi/
out=$(mktemp -d "${TMPDIR:-/tmp}/ucp-cuda-build.XXXXXX")
$GO test -tags cuda -c -o "$out/load.test" ./internal/load/
$GO build -tags cuda -o "$out/ucp" ./cmd/ucp
$GO build -tags cuda -buildmode=c-shared -o "$out/libucp.so" ./capi
# libucp.so opens libcuda and libnccl at run time: it must not need them to load
if ldd "$out/libucp.so" | grep -E "libcuda|libnccl|libcudart"; then echo "cuda-check: libucp.so links CUDA" >&2; exit 1; fi
ls -l "$out"
rm -rf "$out"
echo "cuda-check: internal/load builds and vets with -tags cuda"
