"""Unpickling Megatron's saved args without Megatron's source: install() serves every megatron.* module
with classes that stand for the pickled ones (enums such as AttnBackend, configs) and are not looked at.
Shared by the check scripts that torch.load Megatron-LM files (check_megatron_adamw.py,
check_megatron_dist_dcp.py); testkit.Torch2 copies it beside them into the chroot.
"""

import importlib.abc
import importlib.machinery
import sys
import types


class _StubType(type):
    def __getattr__(cls, attr):  # enum members: AttnBackend.auto
        if attr.startswith("__"):
            raise AttributeError(attr)
        return cls()


class _Stub(metaclass=_StubType):
    """Stands for a Megatron class pickled in args (enums, configs): not looked at."""

    def __init__(self, *a, **k):
        pass

    def __setstate__(self, state):
        pass


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves megatron.* modules whose every attribute is _Stub: no Megatron source needed."""

    def find_spec(self, name, path=None, target=None):
        if name == "megatron" or name.startswith("megatron."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = _stub_class
        return m

    def exec_module(self, module):
        pass


def _stub_class(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    if attr == "MCoreMetadata":  # core 0.15's DCP Metadata subclass (+ mcore_data)
        from torch.distributed.checkpoint.metadata import Metadata

        return type(attr, (Metadata,), {})
    return type(attr, (_Stub,), {})


def install():
    """Serves megatron.* from the stubs (once)."""
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())
