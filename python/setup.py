"""Installs package ucp with its loader library libucp.so (the C ABI in ../capi, capi/ABI.md).

At install time libucp.so is built with Go (`go` on PATH, or GO=/path/to/go; Go 1.26+) from the repository
this folder sits in; without Go, the python/ucp/libucp.so that `make python` wrote is used. So
`pip install ./python` works into any environment that has torch (add --no-build-isolation offline).
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PREBUILT = os.path.join(HERE, "ucp", "libucp.so")


class BuildWithLib(build_py):
    """build_py that also puts libucp.so into the built package."""

    def run(self):
        super().run()
        out = os.path.abspath(os.path.join(self.build_lib, "ucp", "libucp.so"))
        go = os.environ.get("GO") or shutil.which("go")
        if go and os.path.isdir(os.path.join(REPO, "capi")):
            os.makedirs(os.path.dirname(out), exist_ok=True)
            subprocess.check_call([go, "build", "-buildmode=c-shared", "-o", out, "./capi"], cwd=REPO)
            header = os.path.splitext(out)[0] + ".h"  # go writes the C header beside the library
            if os.path.exists(header):
                os.remove(header)
        elif os.path.exists(PREBUILT):
            shutil.copyfile(PREBUILT, out)
        else:
            raise SystemExit("ucp: libucp.so is needed: install Go 1.26+ (go on PATH, or GO=/path/to/go) so that "
                             f"it is built from {REPO}/capi, or run `make python` in the repository first")


class BinaryDistribution(Distribution):
    """The package holds a shared library: its wheel is platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLib}, distclass=BinaryDistribution)
