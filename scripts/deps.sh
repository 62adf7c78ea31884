#!/usr/bin/env bash
# Installs what the tests need beyond Go: Debian's python3-torch (real torch
# checks fixtures and reads what ucp writes) and make. Idempotent; quiet when
# everything is present.
set -euo pipefail
need=()
command -v make >/dev/null 2>&1 || need+=(make)
/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1 || need+=(python3-torch python3-numpy)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "deps: missing ${need[*]} and not root; real-torch checks will be skipped" >&2
    exit 0
  fi
fi
echo "deps: installing ${need[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
