#!/usr/bin/env bash
# Real torch 2.x (DCP, FSDP2, DTensor) and the safetensors package, from Debian 13's
# archive, in a chroot: Debian 12 ships only torch 1.13.
#
#   scripts/torch2-chroot.sh build          make the chroot once (about 5 minutes, 1.6 GB); reused after
#   scripts/torch2-chroot.sh path           print the chroot's folder
#   scripts/torch2-chroot.sh remove         unmount and delete it
#   scripts/torch2-chroot.sh run DIR CMD..  run CMD inside, in the host folder DIR mounted at a path of
#                                           its own (CMD's paths relative to DIR; PYTHONPATH unset)
#
# The chroot lives in $UCP_TORCH2_CHROOT (default /var/cache/ucp/trixie): outside the
# repository, so a fresh clone on the same machine reuses it. It is complete only when
# its .ucp-complete marker exists; the build's logs and lock lie beside it
# ($root.debootstrap.log, $root.apt.log, $root.build.lock). An interrupted debootstrap is started over; an interrupted
# package install is resumed (dpkg --configure -a, then apt-get again).
set -euo pipefail
root=${UCP_TORCH2_CHROOT:-/var/cache/ucp/trixie}
pkgs=python3,python3-torch,python3-numpy,python3-safetensors,python3-pydantic,python3-hjson,python3-packaging,python3-psutil,python3-tqdm,python3-einops,python3-yaml,python3-zstandard,python3-regex,python3-requests,python3-filelock,python3-setuptools

need_root() {
  if [ "$(id -u)" -ne 0 ]; then echo "torch2-chroot: must run as root (debootstrap, chroot, mount)" >&2; exit 1; fi
}

build() {
  need_root
  mkdir -p "$(dirname "$root")"
  # One builder at a time; a second waits and then finds the work done.
  exec 8>"$root.build.lock"
  flock 8
  if [ ! -f "$root/.ucp-base" ] && [ ! -f "$root/.ucp-complete" ]; then
    base
  fi
  install_pkgs
  flock -u 8
}

# A minimal Debian 13 base: debootstrap installs only what it can resolve by itself
# (it cannot resolve virtual packages such as python3-zstandard's
# python3-cffi-backend-api-min), so every package of $pkgs goes in with apt-get
# below, the one path for a fresh build and an incremental one alike.
base() {
  if ! command -v debootstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  # Leftovers of an interrupted build are ours (no .ucp-base marker): start over.
  local d
  for d in "$root" "$root.tmp"; do
    if [ -e "$d" ]; then
      unmount_all "$d"
      rm -rf --one-file-system "$d"
    fi
  done
  local log
  log="$root.debootstrap.log"
  echo "torch2-chroot: debootstrap trixie into $root (about 5 minutes with the packages)" >&2
  if ! debootstrap --variant=minbase trixie "$root.tmp" >"$log" 2>&1; then
    echo "torch2-chroot: debootstrap failed; the last lines of $log:" >&2
    tail -20 "$log" >&2
    unmount_all "$root.tmp"
    rm -rf --one-file-system "$root.tmp"
    exit 1
  fi
  mv "$root.tmp" "$root"
  touch "$root/.ucp-base"
}

# Installs $pkgs with apt-get inside the chroot where missing: the fresh build
# and a chroot made before a package joined the list take this same path. The
# list installed is remembered in .ucp-pkgs; .ucp-complete marks a usable chroot.
install_pkgs() {
  if [ -f "$root/.ucp-complete" ] && [ "$(cat "$root/.ucp-pkgs" 2>/dev/null)" = "$pkgs" ]; then
    return 0
  fi
  local log
  log="$root.apt.log"
  : >"$log"
  echo "torch2-chroot: installing ${pkgs//,/ } into $root" >&2
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  # A killed earlier run may have left dpkg half way: finish it first (a no-op
  # otherwise), then update and install; one more round if that fails.
  local rc=1 try
  for try in 1 2; do
    rc=0
    {
      chroot "$root" env DEBIAN_FRONTEND=noninteractive dpkg --configure -a &&
        chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq &&
        chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
          --no-install-recommends ${pkgs//,/ }
    } >>"$log" 2>&1 || rc=$?
    [ $rc -eq 0 ] && break
  done
  if [ $rc -ne 0 ]; then
    echo "torch2-chroot: apt-get install in the chroot failed; the last lines of $log:" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  chroot "$root" apt-get clean >/dev/null 2>&1 || true
  echo "$pkgs" >"$root/.ucp-pkgs"
  touch "$root/.ucp-complete"
}

# Every mount under a chroot folder, deepest first: those of our runs and builds,
# and those a killed debootstrap leaves (proc, sys, dev, dev/pts ...), so the
# folder can be removed without rm crossing into a mounted file system.
unmount_all() {
  local d m
  d=$(readlink -f "${1:-$root}")
  while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done < <(awk -v d="$d/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
}

run() {
  need_root
  build
  local dir=$1; shift
  dir=$(readlink -f "$dir")
  # The shared mounts are set up once, under a short lock; each run then gets its
  # own mount point, so runs from different folders go on side by side.
  exec 9>"$root/.ucp-run.lock"
  flock 9
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  if ! mountpoint -q "$root/dev"; then mount --rbind /dev "$root/dev"; mount --make-rslave "$root/dev"; fi
  mountpoint -q "$root/dev/shm" || mount -t tmpfs tmpfs "$root/dev/shm"
  flock -u 9
  exec 9>&-
  local mnt=/run/ucp-work.$$
  mkdir -p "$root$mnt"
  mount --bind "$dir" "$root$mnt"
  local rc=0
  chroot "$root" /usr/bin/env -u PYTHONPATH HOME=/tmp PYTHONDONTWRITEBYTECODE=1 \
    /bin/sh -c 'cd "$0" && exec "$@"' "$mnt" "$@" || rc=$?
  umount -l "$root$mnt" || true
  rmdir "$root$mnt" 2>/dev/null || true
  return $rc
}

# Removes the chroot (after unmounting whatever is mounted inside it).
remove() {
  need_root
  local d
  for d in "$root" "$root.tmp"; do
    if [ -e "$d" ]; then
      unmount_all "$d"
      rm -rf --one-file-system "$d"
    fi
  done
  rm -f "$root.debootstrap.log" "$root.apt.log" "$root.build.lock"
}

case "${1:-}" in
  build) build ;;
  remove) remove ;;
  path) echo "$root" ;;
  run) shift; [ $# -ge 2 ] || { echo "usage: $0 run DIR CMD..." >&2; exit 2; }; run "$@" ;;
  *) echo "usage: $0 build | path | remove | run DIR CMD..." >&2; exit 2 ;;
esac
