"""The two compiled libraries: the Rust training side (C ABI) and TensorFlow's op library."""

import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_native = None
_ops = None


def native():
    """The Rust library (ctypes), with its signatures declared. Every call but the shutdown
    names its job: the program's job index (1 for the first; see python/native/src/ffi.rs)."""
    global _native
    if _native is None:
        lib = ctypes.CDLL(os.path.join(_HERE, "liblode_training.so"))
        job = ctypes.c_int64
        lib.lode_connect.argtypes = [job, ctypes.c_char_p]
        lib.lode_connect.restype = ctypes.c_int32
        lib.lode_run_finished.argtypes = [job]
        lib.lode_run_finished.restype = ctypes.c_int32
        lib.lode_iterator_init.argtypes = [job]
        lib.lode_iterator_init.restype = ctypes.c_int32
        lib.lode_position.argtypes = [job]
        lib.lode_position.restype = ctypes.c_int64
        lib.lode_resume.argtypes = [job, ctypes.c_int64]
        lib.lode_resume.restype = ctypes.c_int32
        lib.lode_pass_begin.argtypes = [job]
        lib.lode_pass_begin.restype = ctypes.c_int64
        lib.lode_seek.argtypes = [job, ctypes.c_int64]
        lib.lode_seek.restype = ctypes.c_int32
        lib.lode_shutdown.restype = ctypes.c_int32
        lib.lode_error_message.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.lode_error_message.restype = ctypes.c_size_t
        _native = lib
    return _native


def last_error():
    lib = native()
    n = lib.lode_error_message(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.lode_error_message(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def check(status, what):
    if status != 0:
        raise RuntimeError(f"lode: {what}: {last_error()}")


def load_ops():
    """Registers Lode's ops (DWRecv, DWIteratorInit, DWPassBegin, DWSeek) with TensorFlow, once."""
    global _ops
    if _ops is None:
        import tensorflow as tf

        native()  # the op library links against it; load it from this package first
        _ops = tf.load_op_library(os.path.join(_HERE, "_lode_ops.so"))
    return _ops
