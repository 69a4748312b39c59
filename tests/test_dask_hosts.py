"""shim.dask.map_pipeline on a cluster of several hosts, for real on one machine: the scheduler,
the workers and the client each on a host of its own (a network namespace cabled to a bridge:
tests/support/hosts.py), talking TCP across it. The client loads the pipeline and deletes its
file before anything is sent (tests/support/dask_hosts_client.py), so the hosts run the bytes
the pickle carries, loaded from memory. A host that vanishes mid-graph and a worker killed while
the pipeline is on its way to it are survived, with the results of one call; a worker that
cannot load the library fails the compute saying so.

Skipped, saying why, where namespaces cannot be made (not root, no iproute2)."""

import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import shim

pytest.importorskip("dask.array")
pytest.importorskip("distributed")

from support.dask_hosts_client import image  # noqa: E402
from support.hosts import NamespacesUnavailable, Network  # noqa: E402

CLIENT = Path(__file__).parent / "support" / "dask_hosts_client.py"

PORT = 8786
# Every process of the cluster: the shim this test imports, and a scheduler that gives up a
# worker it has not heard from in 5 s (its floor: 10 heartbeats), not in 5 minutes: a host that
# vanishes sends nothing to say so.
ENVIRONMENT = {"PYTHONPATH": os.pathsep.join(
                   path for path in [str(Path(shim.__file__).parents[1]),
                                     *os.environ.get("PYTHONPATH", "").split(os.pathsep)] if path),
               "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "5s"}


@pytest.fixture
def network(tmp_path):
    try:
        network = Network(tmp_path)
    except NamespacesUnavailable as e:
        pytest.skip(str(e))
    try:
        yield network
    finally:
        network.close()


class Cluster:
    """A scheduler and workers, each on a host of its own, and a host for the client."""

    def __init__(self, network: Network, workers: list[str], env: dict | None = None):
        env = env or {}
        self.network = network
        self.scheduler = network.host("scheduler")
        self.workers = {name: network.host(name) for name in workers}
        self.client = network.host("client")
        self.address = f"tcp://{self.scheduler.address}:{PORT}"
        scheduler = self.scheduler.start(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
             self.scheduler.address, "--port", str(PORT), "--no-dashboard"],
            env={**ENVIRONMENT, **env.get("scheduler", {})})
        for name, host in self.workers.items():
            # (A worker keeps trying to reach the scheduler until it is up.)
            host.start([sys.executable, "-m", "distributed.cli.dask_worker", self.address,
                        "--host", host.address, "--name", name, "--nthreads", "2",
                        "--no-nanny", "--no-dashboard", "--local-directory", str(host.home)],
                       env={**ENVIRONMENT, **env.get(name, {})})
        self.client_env = {**ENVIRONMENT, **env.get("client", {})}
        # The client gives up a scheduler it cannot reach in 30 s: it starts once this one
        # listens, however long a busy machine takes to start it.
        while not re.search(rf"Scheduler at: +{self.address}\n", self.scheduler.log.read_text()):
            if scheduler.poll() is not None:
                pytest.fail(f"the scheduler ended ({scheduler.returncode}):\n{self.logs()}")
            time.sleep(0.05)

    def logs(self) -> str:
        """The end of every host's log (dask logs to stderr), for a failure's message."""
        return "\n".join(f"--- {host.role}:\n{host.log.read_text()[-4000:]}"
                         for host in [self.scheduler, *self.workers.values(), self.client])

    def run_client(self, library: Path, scenario: str, *arguments: str):
        return Client(self, self.client.start(
            [sys.executable, str(CLIENT), self.address, str(library), str(len(self.workers)),
             scenario, *arguments], env=self.client_env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True))


class Client:
    """The client program, as the test talks with it (tests/support/dask_hosts_client.py)."""

    def __init__(self, cluster, process):
        self.cluster, self.process = cluster, process

    def hear(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            pytest.fail(f"the client ended ({self.process.returncode}):\n{self.cluster.logs()}")
        return json.loads(line)

    def say(self, word: str) -> None:
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()


def mapped(pid: int) -> set[str]:
    """What process ``pid`` has mapped from files (its libraries among them)."""
    with open(f"/proc/{pid}/maps") as maps:
        fields = [line.split(None, 5) for line in maps]
    return {f[5].strip() for f in fields if len(f) == 6}


def loaded_from_memory(names: set[str], digest: str) -> bool:
    """Whether a library of this sha256 is among ``names`` as unpickling loads one: from a
    sealed memory file (shim/calls/pipeline_pickle.py), no path on the file system."""
    return f"/memfd:halide-shim {digest} (deleted)" in names


@pytest.fixture
def blur(host_pipelines, tmp_path):
    """A copy of the 3x3 blur's library for the client to load and delete, its sha256, and
    the Pipeline loaded here from the original."""
    original = host_pipelines["blur3x3", "bundled"]
    library = tmp_path / "blur3x3.so"
    shutil.copyfile(original, library)
    return library, hashlib.sha256(library.read_bytes()).hexdigest(), shim.load(original)


def test_a_host_vanishes_mid_graph_and_the_result_is_one_calls(network, blur):
    """Three workers run two pipelines, the second over the first's chunks; between them, a
    task per chunk waits until the test has made a host vanish: one that holds chunks of the
    first pipeline no other host has. The rest of the graph runs on the other two, the lost
    chunks computed again, and the result is the one two whole calls give. Every host that ran
    a chunk had loaded the library from the pickle's bytes; the scheduler, none."""
    library, digest, pipeline = blur
    cluster = Cluster(network, ["w1", "w2", "w3"])
    client = cluster.run_client(library, "host_dies_mid_graph")
    assert set(client.hear()["workers"]) == {"w1", "w2", "w3"}
    assert not library.exists()  # (the client deleted it: no host can open it)
    told = client.hear()
    victim = cluster.workers[told["kill"]]
    assert told["lost"] >= 1
    assert loaded_from_memory(mapped(victim.processes[0].pid), digest)
    network.vanish(victim)
    client.say("killed")
    done = client.hear()
    survivors = set(cluster.workers) - {victim.role}
    assert set(done["workers"]) == survivors
    assert done["first_runs"] > done["chunks"]  # (what was lost was computed again)
    expected = np.asarray(pipeline(np.asarray(pipeline(image()))))
    got = np.load(done["result"])
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    assert victim.role in done["ran"] and set(done["ran"]) & survivors
    for name in set(done["ran"]) & survivors:
        assert loaded_from_memory(mapped(cluster.workers[name].processes[0].pid), digest)
    # (No pipeline loaded from bytes: the shim's own files may be mapped, and are where the
    # caches' folder is named halide-shim..., as CI's is.)
    assert not any(name.startswith("/memfd:halide-shim")
                   for name in mapped(cluster.scheduler.processes[0].pid))


PADDING = 8 << 20


def test_a_worker_killed_while_the_pipeline_is_on_its_way_to_it(network, blur):
    """The graph goes to one worker while it lives; its cable carries 16 Mbit/s, and the
    library is made 8 MiB larger (after its ELF contents, which the loader ignores): 4 s on the
    way. The worker is killed a quarter of the way; the other worker runs the graph."""
    library, _, pipeline = blur
    library.write_bytes(library.read_bytes() + bytes(PADDING))
    digest = hashlib.sha256(library.read_bytes()).hexdigest()
    cluster = Cluster(network, ["w1", "w2"])
    victim = cluster.workers["w2"]
    network.limit(victim, "16mbit")
    client = cluster.run_client(library, "worker_dies_receiving_the_pipeline", "w2")
    client.hear()
    before = victim.received_bytes()
    client.say("go")
    assert client.hear() == {"computing": True}
    while (received := victim.received_bytes() - before) < PADDING // 4:
        # (The client says nothing more until the graph ends: if it does, it ended without
        # sending the pipeline to the victim.)
        said, _, _ = select.select([client.process.stdout], [], [], 0.005)
        assert not said, f"the graph ended first: {client.hear()}"
    network.kill(victim)
    assert received < PADDING  # (not all of the pipeline had arrived)
    done = client.hear()
    assert done["workers"] == ["w1"]
    assert set(done["ran"]) == {"w1"}
    np.testing.assert_array_equal(np.load(done["result"]), np.asarray(pipeline(image())))
    assert loaded_from_memory(mapped(cluster.workers["w1"].processes[0].pid), digest)


@pytest.fixture
def needs_a_library(tmp_path):
    """(folder, library, reference): a folder holding libextra.so, the library of a pipeline
    linked against it (it loads only where the dynamic loader finds libextra.so, here only
    through $LD_LIBRARY_PATH), and the same pipeline's code linked without it, loaded."""
    hl = pytest.importorskip("halide", reason="compiling the test pipeline needs halide")
    (tmp_path / "extra.c").write_text("int shim_test_extra(void) { return 43; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "libextra.so"),
                    str(tmp_path / "extra.c")], check=True)
    x, y = hl.Var("x"), hl.Var("y")
    src = hl.ImageParam(hl.UInt(16), 2, "src")
    edge = hl.BoundaryConditions.repeat_edge(src)
    out = hl.Func("needs")
    out[x, y] = edge[x - 1, y] + edge[x + 2, y + 1]
    out.compile_to({hl.OutputFileType.object: str(tmp_path / "needs.o")}, [src], "needs",
                   hl.Target("host"))
    link = ["cc", "-shared", str(tmp_path / "needs.o"), "-lpthread", "-ldl"]
    subprocess.run([*link, "-o", str(tmp_path / "alone.so")], check=True)
    subprocess.run([*link, "-o", str(tmp_path / "needs.so"), "-Wl,--no-as-needed",
                    f"-L{tmp_path}", "-lextra"], check=True)
    return tmp_path, tmp_path / "needs.so", shim.load(tmp_path / "alone.so")


def test_a_host_that_cannot_load_the_library_fails_the_compute_saying_so(network,
                                                                          needs_a_library):
    """The library links libextra.so, which the client and one worker find and the scheduler
    and the other worker do not. The graph on the latter fails with the load's error, naming
    the pipeline, the worker's process and what is missing; the same graph runs on the former.
    (When the graph carried the Pipeline itself, the scheduler failed to unpickle the graph; and
    with a scheduler that could, a worker fetching the pipeline from another worker and failing
    to unpickle it tried again forever: the compute hung, the error in that worker's log.)"""
    folder, library, reference = needs_a_library
    finds = {"LD_LIBRARY_PATH": str(folder)}
    cluster = Cluster(network, ["sick", "well"], env={"client": finds, "well": finds})
    client = cluster.run_client(library, "one_host_cannot_load", "sick", "well")
    client.hear()
    failed = client.hear()
    assert failed["raised"] == "ArgumentError" and failed["shim_error"]
    assert failed["message"].startswith("pipeline: needs cannot be loaded on this worker")
    assert f"process {cluster.workers['sick'].processes[0].pid})" in failed["message"]
    assert "libextra.so: cannot open shared object file" in failed["message"]
    np.testing.assert_array_equal(np.load(client.hear()["result"]),
                                  np.asarray(reference(image())))
