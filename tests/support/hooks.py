"""Running test code at an exact point of the shim's Python code."""

import sys


class OnEntry:
    """Runs ``action`` (once) as the function with ``code`` is entered on this thread: code the
    fast paths call back, or a finalizer, where a signal handler or the collector could land."""

    def __init__(self, code, action):
        self.code, self.action, self.fired = code, action, False

    def __enter__(self):
        def profile(frame, event, arg):
            if event == "call" and frame.f_code is self.code and not self.fired:
                self.fired = True
                self.action()

        sys.setprofile(profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
