"""The client of tests/test_dask_hosts.py's clusters, run on a host of its own (a network
namespace: tests/support/hosts.py):

    python dask_hosts_client.py SCHEDULER LIBRARY WORKERS SCENARIO [ARGUMENTS...]

It loads the pipeline from LIBRARY and deletes the file, so that no host can open it, connects
to the scheduler, waits for WORKERS workers and plays SCENARIO (a function below) with the test:
it says what happens as JSON lines on stdout and waits for the test's word on stdin where the
test acts (kills a host). The functions the tasks run are this script's, so they travel by
value (cloudpickle), and the workers need nothing but the shim and dask.
"""

import json
import os
import sys
import time
from collections import Counter

import dask.array as da
import distributed
import numpy as np

import shim
from shim.dask import map_pipeline


def image(shape=(512, 512)) -> np.ndarray:
    """The input every scenario maps (the test makes the same to check the results)."""
    return np.random.default_rng(43).integers(0, 60000, shape, dtype=np.uint16)


def say(**facts) -> None:
    print(json.dumps(facts), flush=True)


def hear(word: str) -> None:
    line = sys.stdin.readline().strip()
    if line != word:
        raise SystemExit(f"expected {word!r} from the test, got {line!r}")


def names(client) -> dict:
    """{address: name} of the workers the scheduler has now (a few: all of them)."""
    return {address: worker["name"]
            for address, worker in client.scheduler_info()["workers"].items()}


def chunk_runs(stream, *layers: str) -> Counter:
    """{worker's address: tasks of these layers it finished}, from a task stream."""
    return Counter(task["worker"] for task in stream.data
                   if task["status"] == "OK" and task["key"][0] in layers)


def held_until(block, release: str, started: str, block_info=None):
    """``block``, once the distributed.Event named ``release`` is set; says on the
    distributed.Queue named ``started`` where it runs, and which block it holds."""
    distributed.Queue(started).put([distributed.get_worker().address,
                                    block_info[0]["chunk-location"]])
    distributed.Event(release).wait()
    return block


def host_dies_mid_graph(client, pipeline, workers):
    """Two pipelines, the second over the first's chunks, and between them a task per chunk
    that waits for an event: the graph cannot end before the test has killed a host. The host
    is one running such a task over a chunk of the first pipeline that no other host has,
    which must then be computed again. (Running, not just given the task: a task still
    queued on a worker may be stolen by another, which would fetch the chunk.) The graph is
    computed unfused, so that the first pipeline's chunks are results of their own."""
    first = map_pipeline(pipeline, da.from_array(image(), chunks=64))
    release, started = distributed.Event(), distributed.Queue()
    held = first.map_blocks(held_until, release.name, started.name,
                            meta=np.empty((0, 0), first.dtype))
    result = map_pipeline(pipeline, held)
    running = set()
    with distributed.get_task_stream(client) as stream:
        future = client.compute(result, optimize_graph=False)
        while True:
            running.update((address, (first.name, *location))
                           for address, location in started.get(batch=True))
            holders = {}
            for address, keys in client.has_what().items():
                for key in keys:
                    holders.setdefault(key, set()).add(address)
            lost = [(address, key) for address, key in running if holders.get(key) == {address}]
            if lost:
                break
            time.sleep(0.02)
        victim = lost[0][0]
        say(kill=workers[victim], lost=sum(address == victim for address, _ in lost))
        hear("killed")
        release.set()
        np.save("result.npy", future.result())
    say(result=os.path.abspath("result.npy"), workers=sorted(names(client).values()),
        first_runs=sum(chunk_runs(stream, first.name).values()), chunks=first.npartitions,
        ran={workers[address]: count
             for address, count in chunk_runs(stream, first.name, result.name).items()})


def worker_dies_receiving_the_pipeline(client, pipeline, workers, victim):
    """The graph computed on ``victim`` if it can be (anywhere if not), once the test says
    "go"; the test kills its processes while the pipeline's bytes are on their way to it."""
    address = {name: worker for worker, name in workers.items()}[victim]
    result = map_pipeline(pipeline, da.from_array(image(), chunks=128))
    hear("go")
    with distributed.get_task_stream(client) as stream:
        future = client.compute(result, workers=[address], allow_other_workers=True)
        say(computing=True)
        np.save("result.npy", future.result())
    say(result=os.path.abspath("result.npy"), workers=sorted(names(client).values()),
        ran={workers[worker]: count for worker, count in chunk_runs(stream, result.name).items()})


def one_host_cannot_load(client, pipeline, workers, sick, well):
    """The graph computed on the host ``sick`` alone, which cannot load the library, then on
    ``well`` alone, which can: what the first raises, and the second's result."""
    address = {name: worker for worker, name in workers.items()}
    result = map_pipeline(pipeline, da.from_array(image(), chunks=128))
    try:
        client.compute(result, workers=[address[sick]]).result()
    except Exception as e:  # (the task's own exception, re-raised here by distributed)
        say(raised=type(e).__name__, shim_error=isinstance(e, shim.ShimError), message=str(e))
    else:
        say(raised=None)
    # (Other chunks, so other keys: the scheduler remembers the first graph's as failed.)
    again = map_pipeline(pipeline, da.from_array(image(), chunks=100))
    np.save("result.npy", client.compute(again, workers=[address[well]]).result())
    say(result=os.path.abspath("result.npy"))


SCENARIOS = {"host_dies_mid_graph": host_dies_mid_graph,
             "worker_dies_receiving_the_pipeline": worker_dies_receiving_the_pipeline,
             "one_host_cannot_load": one_host_cannot_load}


def main():
    scheduler, library, workers, scenario, *arguments = sys.argv[1:]
    pipeline = shim.load(library)
    os.unlink(library)
    with distributed.Client(scheduler) as client:
        client.wait_for_workers(int(workers))
        known = names(client)
        say(workers={name: address for address, name in known.items()})
        SCENARIOS[scenario](client, pipeline, known, *arguments)


if __name__ == "__main__":
    main()
