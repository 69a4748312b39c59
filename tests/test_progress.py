"""Progress of long work (shim/base/progress.py) shows only on a terminal: a bar over known
steps, and a line for a block that turns out slow (the first OpenCL compile), with how long it
took; nothing for a pipe or a quick block."""

import io
import threading
import time

from shim.base.progress import Progress, if_slow


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_slow_block_says_so_and_how_long_it_took():
    out = Terminal()
    with if_slow("compiling", after=0.05, stream=out):
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert lines[0] == "halide-shim: compiling..."
    assert lines[1].startswith("halide-shim: compiling: done in ") and lines[1].endswith(" s")
    assert float(lines[1].split("done in ")[1][:-2]) >= 0.3 - 0.05


def test_a_quick_block_or_a_pipe_hears_nothing_and_leaves_no_thread():
    before = threading.active_count()
    quick = Terminal()
    with if_slow("quick", after=5, stream=quick):
        pass
    piped = io.StringIO()
    with if_slow("piped", after=0, stream=piped):
        time.sleep(0.05)
    assert quick.getvalue() == "" and piped.getvalue() == ""
    assert threading.active_count() == before


def test_an_exception_in_a_slow_block_still_ends_its_line():
    out = Terminal()
    try:
        with if_slow("failing", after=0.01, stream=out):
            time.sleep(0.1)
            raise KeyError("x")
    except KeyError:
        pass
    assert out.getvalue().count("failing") == 2


def test_the_bar_draws_on_a_terminal_only():
    shown, piped = Terminal(), io.StringIO()
    for stream in (shown, piped):
        bar = Progress(4, "runs", stream)
        for done in range(1, 5):
            bar.update(done)
        bar.finish()
    assert shown.getvalue().endswith("runs [" + "#" * 30 + "] 4/4\n")
    assert piped.getvalue() == ""
