"""Halide's runtime hooks installed through the shim's runtime with ctypes, as a program
embedding the shim would (tests/test_build_flavors*.py)."""

import ctypes

import shim._native

RUNTIME = ctypes.CDLL(shim._native.__file__)
MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
MESSAGE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
TRACE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)
DO_PAR_FOR = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                              ctypes.c_int, ctypes.c_void_p)


def runtime_function(name, restype, argtypes):
    function = getattr(RUNTIME, name)
    function.restype, function.argtypes = restype, argtypes
    return function


DEFAULT_MALLOC = runtime_function("halide_default_malloc", ctypes.c_void_p,
                                  [ctypes.c_void_p, ctypes.c_size_t])
DEFAULT_FREE = runtime_function("halide_default_free", None, [ctypes.c_void_p, ctypes.c_void_p])


class Hooks:
    """Halide's hooks installed through the shim's runtime, as a program embedding it would
    (ctypes), put back as they were on leaving the ``with`` block: {setter name: (type,
    function)}."""

    def __init__(self, **hooks):
        self.hooks = {name: kind(function) for name, (kind, function) in hooks.items()}
        self.previous = {}

    def __enter__(self):
        for name, function in self.hooks.items():
            setter = runtime_function(name, type(function), [type(function)])
            self.previous[name] = setter(function)
        return self

    def __exit__(self, *exc):
        for name, function in self.previous.items():
            runtime_function(name, type(function), [type(function)])(function)


class FailingSecondMalloc:
    """An application's halide_malloc that fails from its second call on, its halide_free,
    and its error handler, counting each (as Halide's cleanup_on_error test's)."""

    def __init__(self):
        self.mallocs = self.failed = self.frees = 0
        self.errors = []
        self.live = set()

    def malloc(self, uc, size):
        if self.mallocs:
            self.failed += 1
            return None
        self.mallocs += 1
        pointer = DEFAULT_MALLOC(uc, size)
        self.live.add(pointer)
        return pointer

    def free(self, uc, pointer):
        if pointer:
            self.frees += 1
            self.live.discard(pointer)
            DEFAULT_FREE(uc, pointer)

    def error(self, uc, message):
        self.errors.append(message.decode())

    def hooks(self):
        return Hooks(halide_set_custom_malloc=(MALLOC, self.malloc),
                     halide_set_custom_free=(FREE, self.free),
                     halide_set_error_handler=(MESSAGE, self.error))
