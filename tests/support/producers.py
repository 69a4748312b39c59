"""A stand-in for another library's array in the DLPack tests."""


class Producer:
    """Another library's array, as far as the shim can tell: the DLPack protocol only, with
    the keyword arguments of each ``__dlpack__`` call kept in ``calls``."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        return self.inner.__dlpack__(**kwargs)
