"""Several hosts on one machine, for tests of a cluster (tests/test_dask_hosts.py): each host is
a network namespace of its own whose one interface, eth0 at 10.43.0.N/24, is cabled by a veth
pair to a bridge in a namespace of its own (the switch). Processes started on a host run in its
namespace (``ip netns exec``) and talk TCP over those cables: they see their host's address
and the other hosts' across the switch, never the machine's own network. A host can vanish
(its cable cut, then its processes killed) or have its processes killed, and the traffic to a
host can be slowed (``tc``).

Nothing is added to the machine's own namespace (the cables are made inside the switch and the
hosts), so the addresses exist only inside this network: two runs at once, each with its own
switch, do not collide, and the machine's network is left as it was. Names are unique to the
run (the process id and a random part); ``close`` kills the processes started here and deletes
the namespaces made here, and nothing else.

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's ``ip`` and ``tc``; a machine where
the namespaces, the bridge or a veth pair cannot be made raises NamespacesUnavailable, saying
why, before anything else is made.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


class NamespacesUnavailable(Exception):
    """This machine cannot make the network (not root, no ``ip``, a kernel without network
    namespaces, bridges or veth pairs): the message says what was tried and what it said."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Host:
    """One host: its namespace, address (on eth0), home folder (its processes' working
    directory and $HOME), the switch's end of its cable, and the processes started on it."""
    role: str
    namespace: str
    address: str
    home: Path
    cable: str
    processes: list = field(default_factory=list)

    @property
    def log(self) -> Path:
        """Where its processes' stderr goes."""
        return self.home / "log"

    def start(self, argv: list[str], env: dict | None = None, **popen) -> subprocess.Popen:
        """Runs ``argv`` on this host, in a session of its own (so that a kill reaches what it
        starts too), in its home folder, with $HOME there and ``env`` over this process's, its
        stderr to ``log``."""
        environment = {**os.environ, "HOME": str(self.home),
                       "XDG_CACHE_HOME": str(self.home / "cache"), **(env or {})}
        with open(self.log, "a") as log:
            # (ip netns exec enters the namespace and then executes argv: the same process.)
            process = subprocess.Popen(["ip", "netns", "exec", self.namespace, *argv],
                                       cwd=self.home, env=environment, start_new_session=True,
                                       stderr=log, **popen)
        self.processes.append(process)
        return process

    def received_bytes(self) -> int:
        """What eth0 has received so far (read in one of the host's processes' view of the
        network: /proc/PID/net/dev is the table of that process's namespace)."""
        with open(f"/proc/{self.processes[0].pid}/net/dev") as table:
            for line in table:
                interface, _, counters = line.partition(":")
                if interface.strip() == "eth0":
                    return int(counters.split()[0])
        raise RuntimeError(f"{self.role}: no eth0 in its process {self.processes[0].pid}")


class Network:
    """The switch and the hosts cabled to it (see the module's docstring)."""

    SUBNET = "10.43.0"

    def __init__(self, folder: Path):
        self.folder = folder
        self.tag = f"shim-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.tag}-switch"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []  # made here, in order: the ones close deletes
        try:
            self._add_namespace(self.switch)
            _ip("-n", self.switch, "link", "add", "name", "bridge", "type", "bridge")
            # A veth pair, tried here, where it costs nothing to give up.
            _ip("-n", self.switch, "link", "add", "name", "probe0", "type", "veth",
                "peer", "name", "probe1")
            _ip("-n", self.switch, "link", "del", "probe0")
        except FileNotFoundError:
            raise NamespacesUnavailable("no ip command (iproute2) to make network namespaces "
                                        "with") from None
        except RuntimeError as e:
            self.close()
            raise NamespacesUnavailable(f"cannot make network namespaces, a bridge and veth "
                                        f"pairs here: {e}") from None
        _ip("-n", self.switch, "link", "set", "bridge", "up")

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)

    def host(self, role: str) -> Host:
        """A new host, cabled to the switch, its links up, with an empty home folder."""
        number = len(self.hosts) + 1
        host = Host(role, f"{self.tag}-{role}", f"{self.SUBNET}.{number}",
                    self.folder / role, f"cable{number}")
        self._add_namespace(host.namespace)
        _ip("-n", self.switch, "link", "add", "name", host.cable, "type", "veth",
            "peer", "name", "eth0", "netns", host.namespace)
        _ip("-n", self.switch, "link", "set", host.cable, "master", "bridge", "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.namespace, "link", "set", "eth0", "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")
        host.home.mkdir(mode=0o700)
        self.hosts[role] = host
        return host

    def limit(self, host: Host, rate: str) -> None:
        """What reaches ``host`` through the switch goes at most at ``rate`` (tc's units:
        "16mbit"), queued, not dropped."""
        done = subprocess.run(["ip", "netns", "exec", self.switch, "tc", "qdisc", "add", "dev",
                               host.cable, "root", "tbf", "rate", rate, "burst", "16kb",
                               "latency", "10s"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"tc on {host.cable}: {done.stderr.strip()}")

    def vanish(self, host: Host) -> None:
        """The host vanishes, as one that loses power does: its cable is cut first, so that
        its peers get no FIN or RST from its dying sockets (they find out as they would across
        a real network, by their timeouts), then its processes are killed."""
        _ip("-n", self.switch, "link", "del", host.cable)
        self.kill(host)

    @staticmethod
    def kill(host: Host) -> None:
        """The host's processes are killed (SIGKILL, each with what it started), as a crash or
        the kernel's OOM killer does: its kernel closes their connections, which its peers
        see at once."""
        for process in host.processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # (its session: what it started too)
            except ProcessLookupError:
                pass  # (it had ended, and its session with it)
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()

    def close(self) -> None:
        """Kills every process started here and deletes every namespace made here (their
        cables go with them); tries each step, then raises the first failure."""
        failures = []
        for host in self.hosts.values():
            try:
                self.kill(host)
            except OSError as e:
                failures.append(e)
        for namespace in reversed(self._namespaces):
            try:
                self._kill_stragglers(namespace)
                _ip("netns", "del", namespace)
            except (OSError, RuntimeError) as e:
                failures.append(e)
        self._namespaces.clear()
        if failures:
            raise failures[0]

    @staticmethod
    def _kill_stragglers(namespace: str) -> None:
        """Kills what is still in ``namespace``, made here: processes that left the sessions
        they were started in (none are expected; a namespace in use would outlive its name)."""
        for _ in range(100):
            listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                                    text=True, check=True).stdout.split()
            if not listed:
                return
            for pid in listed:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        raise RuntimeError(f"processes {listed} in {namespace} survive SIGKILL")
