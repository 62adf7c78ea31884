#!/bin/sh
# make check-deepspeed DS_SRC=DIR: runs DeepSpeed's engine from the source tree DIR (v0.14.5) on CPU against
# what 'ucp reshard --to deepspeed' writes (testdata/check/deepspeed_engine.py). Installs the Debian packages
# DeepSpeed imports (deepspeed-on-cpu recipe) when they are missing.
set -eu
DS_SRC=$1
UCP=${2:-bin/ucp}
PY=/usr/bin/python3
if ! $PY -c 'import torch, cpuinfo, pydantic, packaging, tqdm, psutil' 2>/dev/null; then
	SUDO=""
	[ "$(id -u)" = 0 ] || SUDO=sudo
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch python3-numpy python3-cpuinfo \
		python3-pydantic python3-packaging python3-tqdm python3-psutil
fi
exec $PY testdata/check/deepspeed_engine.py --ds-src "$DS_SRC" --ucp "$UCP"
