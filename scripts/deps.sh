#!/usr/bin/env bash
# Installs what the tests need beyond Go: make, Debian's python3-torch 1.13
# (real torch checks fixtures and reads what ucp writes; its torchrun is a
# launcher test's), openmpi-bin, slurmctld, slurmd, slurm-client and munge
# (the launcher tests), librsvg2-bin
# (rsvg-convert renders the report's timeline), node and the apache-arrow npm
# package (reads the --arrow files), and, as root, the
# Debian 13 chroot with real torch 2.x and safetensors (scripts/torch2-chroot.sh,
# built once and reused). Idempotent; quiet when everything is present.
#
# Caches outside the repository, each moved by its variable: the chroot
# (UCP_TORCH2_CHROOT, default /var/cache/ucp/trixie), npm's download cache
# (npm_config_cache, default ~/.npm); scripts/cuda-check.sh's UCP_CUDA_CACHE.
# What apt and npm print goes to $UCP_DEPS_LOG (default /tmp/ucp-deps.log);
# a failure prints its last lines.
set -euo pipefail
cd "$(dirname "$0")/.."
log=${UCP_DEPS_LOG:-${TMPDIR:-/tmp}/ucp-deps.log}
mkdir -p "$(dirname "$log")" && : >"$log"

# logged WHAT CMD...: runs CMD with its output in the log; on failure says
# what failed and prints the log's last lines.
logged() {
  local what=$1; shift
  if ! "$@" >>"$log" 2>&1; then
    echo "deps: $what failed; the last lines of $log:" >&2
    tail -n 25 "$log" >&2
    return 1
  fi
}
need=()
command -v make >/dev/null 2>&1 || need+=(make)
/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1 || need+=(python3-torch python3-numpy)
# rsvg-convert renders convert --report's SVG timeline in report's tests.
command -v rsvg-convert >/dev/null 2>&1 || need+=(librsvg2-bin)
# node runs the apache-arrow JavaScript package, the independent reader of
# the Arrow files of inspect/convert --arrow (arrowtable's tests).
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# The launcher tests (cmd/ucp TestMpirun, TestTorchrun, TestSrun) start ucp
# nodes with Open MPI's mpirun, torchrun (python3-torch) and srun on a
# one-host Slurm cluster with munge, whose daemons the test starts itself.
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
command -v srun >/dev/null 2>&1 || need+=(slurm-client)
command -v slurmctld >/dev/null 2>&1 || need+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need+=(slurmd)
command -v munged >/dev/null 2>&1 || need+=(munge)
sudo=""
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "deps: missing ${need[*]} and not root; the checks that need them will be skipped" >&2
    need=()
  fi
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]} with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt=($sudo apt-get -o DPkg::Lock::Timeout=600)
  logged "apt-get update" "${apt[@]}" update -qq
  # A first install on a fresh machine has been seen to fail in dpkg's configure
  # step; finishing the configuration and trying once more succeeds.
  if ! "${apt[@]}" install -y -qq --no-install-recommends "${need[@]}" >>"$log" 2>&1; then
    $sudo dpkg --configure -a >>"$log" 2>&1 || true
    logged "apt-get install ${need[*]}" "${apt[@]}" install -y -qq --no-install-recommends "${need[@]}"
  fi
fi
# apache-arrow from the npm registry, at the version package-lock.json pins.
if [ ! -f testdata/arrowcheck/node_modules/apache-arrow/package.json ] && command -v npm >/dev/null 2>&1; then
  echo "deps: npm ci in testdata/arrowcheck (apache-arrow)" >&2
  logged "npm ci in testdata/arrowcheck" sh -c 'cd testdata/arrowcheck && npm ci --no-audit --no-fund --loglevel=error'
fi
if [ "$(id -u)" -eq 0 ]; then
  # It prints the last lines of its own logs when it fails.
  ./scripts/torch2-chroot.sh build || { echo "deps: scripts/torch2-chroot.sh build failed" >&2; exit 1; }
fi
