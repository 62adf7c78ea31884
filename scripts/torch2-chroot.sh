#!/usr/bin/env bash
# Real torch 2.x (DCP, FSDP2, DTensor) and the safetensors package, from Debian 13's
# archive, in a chroot: Debian 12 ships only torch 1.13.
#
#   scripts/torch2-chroot.sh build          make the chroot once (about 5 minutes, 1.6 GB); reused after
#   scripts/torch2-chroot.sh path           print the chroot's folder
#   scripts/torch2-chroot.sh run DIR CMD..  run CMD inside with the host folder DIR mounted at /work
#                                           (CMD's paths relative to DIR; PYTHONPATH unset)
#
# The chroot lives in $UCP_TORCH2_CHROOT (default /var/cache/ucp/trixie): outside the
# repository, so a fresh clone on the same machine reuses it. It is complete only when
# its .ucp-complete marker exists; an interrupted build is started over.
set -euo pipefail
root=${UCP_TORCH2_CHROOT:-/var/cache/ucp/trixie}
pkgs=python3,python3-torch,python3-numpy,python3-safetensors,python3-pydantic,python3-hjson,python3-packaging,python3-psutil,python3-tqdm,python3-einops,python3-yaml,python3-zstandard

need_root() {
  if [ "$(id -u)" -ne 0 ]; then echo "torch2-chroot: must run as root (debootstrap, chroot, mount)" >&2; exit 1; fi
}

build() {
  need_root
  if [ -f "$root/.ucp-complete" ]; then
    add_missing
    return 0
  fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  # A partial tree from an interrupted run is ours (it has no marker): start it over.
  if [ -e "$root" ]; then
    unmount_all
    rm -rf --one-file-system "$root"
  fi
  mkdir -p "$(dirname "$root")"
  echo "torch2-chroot: debootstrap trixie into $root (about 5 minutes)" >&2
  debootstrap --variant=minbase --include="$pkgs" trixie "$root.tmp" >"$(dirname "$root")/debootstrap.log" 2>&1 || {
    echo "torch2-chroot: debootstrap failed; see $(dirname "$root")/debootstrap.log" >&2
    tail -20 "$(dirname "$root")/debootstrap.log" >&2
    exit 1
  }
  mv "$root.tmp" "$root"
  echo "$pkgs" >"$root/.ucp-pkgs"
  touch "$root/.ucp-complete"
}

# A chroot built before a package joined $pkgs gets it added (once: the list is
# remembered in .ucp-pkgs).
add_missing() {
  [ "$(cat "$root/.ucp-pkgs" 2>/dev/null)" = "$pkgs" ] && return 0
  exec 8>"$(dirname "$root")/.ucp-apt.lock"
  flock 8
  if [ "$(cat "$root/.ucp-pkgs" 2>/dev/null)" != "$pkgs" ]; then
    echo "torch2-chroot: installing ${pkgs//,/ } into $root where missing" >&2
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      --no-install-recommends ${pkgs//,/ } >"$(dirname "$root")/apt.log" 2>&1 || {
      echo "torch2-chroot: apt-get install in the chroot failed; see $(dirname "$root")/apt.log" >&2
      exit 1
    }
    echo "$pkgs" >"$root/.ucp-pkgs"
  fi
  flock -u 8
}

unmount_all() {
  local m
  for m in work dev/shm dev proc; do
    mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m" || true
  done
}

run() {
  need_root
  build
  local dir=$1; shift
  dir=$(readlink -f "$dir")
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  if ! mountpoint -q "$root/dev"; then mount --rbind /dev "$root/dev"; mount --make-rslave "$root/dev"; fi
  mountpoint -q "$root/dev/shm" || mount -t tmpfs tmpfs "$root/dev/shm"
  mkdir -p "$root/work"
  # One mount of /work at a time: a concurrent run with another DIR would be wrong.
  exec 9>"$root/.ucp-run.lock"
  flock 9
  mountpoint -q "$root/work" && umount -l "$root/work"
  mount --bind "$dir" "$root/work"
  local rc=0
  chroot "$root" /usr/bin/env -u PYTHONPATH HOME=/tmp PYTHONDONTWRITEBYTECODE=1 \
    /bin/sh -c 'cd /work && exec "$@"' sh "$@" || rc=$?
  umount -l "$root/work" || true
  return $rc
}

case "${1:-}" in
  build) build ;;
  path) echo "$root" ;;
  run) shift; [ $# -ge 2 ] || { echo "usage: $0 run DIR CMD..." >&2; exit 2; }; run "$@" ;;
  *) echo "usage: $0 build | path | run DIR CMD..." >&2; exit 2 ;;
esac
