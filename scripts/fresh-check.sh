#!/usr/bin/env bash
# The fresh-machine check: clones this repository's HEAD into a new folder and runs the CI entry point
# there (`CI=true bash .ci/run`: scripts/deps.sh, then make test) with every cache that lives outside
# the clone pointed at a folder that does not exist yet, so nothing an earlier build left behind helps:
#   UCP_TORCH2_CHROOT   the torch 2.x chroot (scripts/torch2-chroot.sh; about 1.6 GB, 5+ minutes)
#   UCP_CUDA_CACHE      CUDA and NCCL headers for make cuda-check (scripts/cuda-check.sh; a 1 GB download)
#   npm_config_cache    npm's download cache (node_modules is inside the clone, so it starts empty too)
#   UCP_DEPS_LOG        scripts/deps.sh's log of apt and npm
# With --go-cache the Go build cache (GOCACHE) starts empty too, with --go-mod-cache the Go module cache
# (GOMODCACHE: the modules are downloaded again). Prints the wall time and the result; on failure the
# log's last lines (the log is kept as WORK.log). Everything is made under WORK (default: a new folder in $TMPDIR or /tmp) and removed
# at the end, the chroot included, unless --keep.
#
#   scripts/fresh-check.sh [--go-cache] [--go-mod-cache] [--keep] [WORK]
#
# Run as root, as CI is (the chroot needs it); it takes a while (the whole test suite).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
gocache=0 gomod=0 keep=0 work=""
for a in "$@"; do
  case $a in
    --go-cache) gocache=1 ;;
    --go-mod-cache) gomod=1 ;;
    --keep) keep=1 ;;
    -*) echo "usage: $0 [--go-cache] [--go-mod-cache] [--keep] [WORK]" >&2; exit 2 ;;
    *) work=$a ;;
  esac
done
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/ucp-fresh.XXXXXX")
elif [ -e "$work" ]; then
  echo "fresh-check: $work exists; give a folder that does not exist yet" >&2
  exit 2
fi
mkdir -p "$work"
work=$(cd "$work" && pwd)
commit=$(git -C "$here" rev-parse HEAD)
clone=$work/ucp
cache=$work/cache
log=$work/ci.log

cleanup() {
  if [ $keep -eq 1 ]; then
    echo "fresh-check: kept $work" >&2
    return
  fi
  UCP_TORCH2_CHROOT=$cache/trixie "$clone/scripts/torch2-chroot.sh" remove 2>/dev/null || true
  # Go's module cache is read-only by design.
  [ $gomod -eq 1 ] && chmod -R u+w "$cache/gomod" 2>/dev/null
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

git clone -q --no-checkout "$here" "$clone"
git -C "$clone" checkout -q --detach "$commit"
export UCP_TORCH2_CHROOT=$cache/trixie UCP_CUDA_CACHE=$cache/cuda npm_config_cache=$cache/npm UCP_DEPS_LOG=$cache/deps.log
[ $gocache -eq 1 ] && export GOCACHE=$cache/go-build
[ $gomod -eq 1 ] && export GOMODCACHE=$cache/gomod
echo "fresh-check: $commit in $clone; caches in $cache (none exists yet); log in $log" >&2
start=$(date +%s)
rc=0
(cd "$clone" && CI=true bash .ci/run) >"$log" 2>&1 || rc=$?
secs=$(($(date +%s) - start))
if [ $rc -ne 0 ]; then
  [ $keep -eq 1 ] || { cp "$log" "$work.log"; log=$work.log; }
  echo "fresh-check: FAILED (exit $rc) after $((secs / 60))m$((secs % 60))s; the last lines of $log:" >&2
  tail -n 40 "$log" >&2
  exit $rc
fi
grep -E '^(ok|FAIL|---)' "$log" | grep -v '^ok' >&2 || true
echo "fresh-check: passed: CI=true bash .ci/run in a fresh clone of $commit took $((secs / 60))m$((secs % 60))s" >&2
