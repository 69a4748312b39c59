"""A child forked while another thread of its parent holds one of the shim's locks: the child
must go on (each module with such a lock makes it anew in the child, os.register_at_fork)."""

import subprocess
import sys
import textwrap


def exit_code_of_child_forked_while_held(setup: str, lock: str, use: str, *args: str) -> int:
    """Run ``setup`` in a new process, hold ``lock`` (an expression) in another thread, fork,
    and run ``use`` in the child (SIGALRM ends it if it waits for good): the child's exit code,
    0 when ``use`` finished."""
    script = textwrap.dedent(setup) + textwrap.dedent(f"""
import os, signal, threading
held, end = threading.Event(), threading.Event()
def holder():
    with {lock}:
        held.set()
        end.wait()
threading.Thread(target=holder, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # (a hang guard: SIGALRM ends a child that waits for good)
    {use}
    os._exit(0)
_, status = os.waitpid(pid, 0)
end.set()
print("child", os.waitstatus_to_exitcode(status))
""")
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("child "), done.stdout + done.stderr[-3000:]
    return int(done.stdout.split()[1])
