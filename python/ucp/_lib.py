"""ctypes binding of libucp.so, ucp's C ABI (capi/ABI.md). Internal: use the functions of package ucp."""

import ctypes
import json
import os

MAX_DIMS = 16
LAYOUT_TP, LAYOUT_CHUNK = 0, 1
STEP_NONE, STEP_INT, STEP_FLOAT, STEP_TENSOR = 0, 1, 2, 3


class UCPError(RuntimeError):
    """An error reported by ucp's loader: bad input, a missing file or state, a target it cannot slice."""


_lib = None


def lib():
    """Loads libucp.so once (beside this file, or UCP_LIBRARY) and declares its functions."""
    global _lib
    if _lib is not None:
        return _lib
    path = os.environ.get("UCP_LIBRARY") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "libucp.so")
    if not os.path.exists(path):
        raise UCPError(f"{path} is missing: build it with `make python` in the ucp repository")
    L = ctypes.CDLL(path)
    err = ctypes.c_void_p  # a malloc'd message or NULL; freed with ucp_free
    h, i64, c_int, cstr = ctypes.c_size_t, ctypes.c_int64, ctypes.c_int, ctypes.c_char_p
    P = ctypes.POINTER
    sigs = {
        "ucp_free": (None, [ctypes.c_void_p]),
        "ucp_open": (err, [cstr, c_int, P(h)]),
        "ucp_close": (err, [h]),
        "ucp_info": (err, [h, P(ctypes.c_void_p)]),
        "ucp_shard": (err, [h, cstr, cstr, i64, i64, i64, i64, P(i64), P(c_int)]),
        "ucp_read": (err, [h, cstr, cstr, i64, i64, i64, i64, i64, i64, c_int, ctypes.c_void_p, i64, P(i64)]),
        "ucp_step": (err, [h, cstr, P(c_int), P(ctypes.c_double)]),
        "ucp_zero_pieces": (err, [i64, i64, i64, P(i64), i64, P(ctypes.c_void_p)]),
        "ucp_balance": (err, [P(i64), i64, i64, P(i64)]),
        "ucp_verify_state": (err, [h, cstr, cstr]),
        "ucp_listen": (err, [cstr, P(h), P(ctypes.c_void_p)]),
        "ucp_listener_close": (err, [h]),
        "ucp_group_load": (err, [h, h, cstr, P(ctypes.c_uint64), P(i64), i64, P(ctypes.c_void_p)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(L, name)
        fn.restype, fn.argtypes = res, args
    _lib = L
    return L


def take_string(p):
    """Copies and frees a C string that libucp allocated."""
    if not p:
        return None
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        lib().ucp_free(p)


def check(p):
    """Raises UCPError with libucp's message when a call failed (p is not NULL)."""
    msg = take_string(p)
    if msg is not None:
        raise UCPError(msg)


def enc(s):
    return s.encode("utf-8")


class Handle:
    """An opened atomic checkpoint inside libucp."""

    def __init__(self, path, verify=False):
        self.h = ctypes.c_size_t(0)
        check(lib().ucp_open(enc(os.fspath(path)), 1 if verify else 0, ctypes.byref(self.h)))

    def close(self):
        if self.h.value:
            check(lib().ucp_close(self.h))
            self.h = ctypes.c_size_t(0)

    def info(self):
        out = ctypes.c_void_p()
        check(lib().ucp_info(self.h, ctypes.byref(out)))
        return json.loads(take_string(out.value))

    def shard_shape(self, param, state, layout, n, rank, padded_vocab):
        shape = (ctypes.c_int64 * MAX_DIMS)()
        nd = ctypes.c_int()
        check(lib().ucp_shard(self.h, enc(param), enc(state), layout, n, rank, padded_vocab or 0, shape, ctypes.byref(nd)))
        return tuple(shape[i] for i in range(nd.value))

    def read(self, param, state, layout, n, rank, padded_vocab, start, count, dtype_code, ptr, nbytes):
        got = ctypes.c_int64()
        check(lib().ucp_read(self.h, enc(param), enc(state), layout, n, rank, padded_vocab or 0, start, count,
                             dtype_code, ctypes.c_void_p(ptr), nbytes, ctypes.byref(got)))
        return got.value

    def verify_state(self, param, state):
        """Checks the size and CRC-32 of a state's file against the manifest."""
        check(lib().ucp_verify_state(self.h, enc(param), enc(state)))

    def step(self, param):
        kind, value = ctypes.c_int(), ctypes.c_double()
        check(lib().ucp_step(self.h, enc(param), ctypes.byref(kind), ctypes.byref(value)))
        return kind.value, value.value


def zero_pieces(stage, dp, rank, numels):
    arr = (ctypes.c_int64 * max(len(numels), 1))(*numels)
    out = ctypes.c_void_p()
    check(lib().ucp_zero_pieces(stage, dp, rank, arr, len(numels), ctypes.byref(out)))
    d = json.loads(take_string(out.value))
    return d["size"], d["pieces"] or []


def balance(weights, n):
    w = (ctypes.c_int64 * max(len(weights), 1))(*weights)
    o = (ctypes.c_int64 * max(len(weights), 1))()
    check(lib().ucp_balance(w, len(weights), n, o))
    return [o[i] for i in range(len(weights))]


def listen(host):
    """Opens this rank's ring listener; returns (handle, "host:port")."""
    h, addr = ctypes.c_size_t(0), ctypes.c_void_p()
    check(lib().ucp_listen(enc(host), ctypes.byref(h), ctypes.byref(addr)))
    return h.value, take_string(addr.value)


def listener_close(h):
    check(lib().ucp_listener_close(h))


def group_load(handle, listener, spec, ptrs, sizes):
    """Runs a group load in libucp (it takes the listener over). Returns (stats dict or None, UCPError or
    None): the stats come back after a failure too."""
    n = len(ptrs)
    p = (ctypes.c_uint64 * max(n, 1))(*ptrs)
    z = (ctypes.c_int64 * max(n, 1))(*sizes)
    out = ctypes.c_void_p()
    msg = take_string(lib().ucp_group_load(handle.h, listener, enc(spec), p, z, n, ctypes.byref(out)))
    st = take_string(out.value)
    return (json.loads(st) if st else None), (UCPError(msg) if msg is not None else None)
