"""Tasks run here, on forked local processes or on Dask: what a sweep and a plan share.

``tabsched sweep`` (``tabsched.sweeps.run_sweep``) and ``tabsched plan``
(``tabsched.plan.search``) hand their tasks to :func:`run_parallel`,
:func:`run_forked` or :func:`run_dask`, with a ``record(index, result, done)``
callback that receives each result as it comes (in any order) and a count of the
tasks done.
"""

import os

from tabsched._extras import require
from tabsched.exceptions import InvalidParameterError, TabschedError

__all__ = ["run_parallel", "run_forked", "run_dask"]


def run_parallel(function, tasks, *, jobs=1, dask=None, record, order=None, warm=None):
    """``record(index, function(tasks[index]), done)`` for every task: here, on ``jobs``
    local processes (this one and ``jobs - 1`` forked from it, each taking the next task
    from a shared counter) or on Dask (``dask``: a scheduler address, ``"local"`` or a
    Client; the ``dask`` extra). ``function`` and the tasks must be picklable for Dask
    and where processes cannot fork; forked processes inherit this one's memos.

    ``order``: the order local processes take the tasks in (default as given; a sweep
    puts its largest tables first); ``warm()``: run once before any process forks, so
    that each inherits what it builds (a sweep's presets and cost models). Serially
    the tasks run as given.
    """
    tasks = list(tasks)
    if jobs < 1:
        raise InvalidParameterError(f"jobs must be >= 1, not {jobs}")
    if dask is not None:
        run_dask(function, tasks, dask, jobs, record)
        return
    if jobs == 1 or len(tasks) <= 1:
        for index, task in enumerate(tasks):
            record(index, function(task), index + 1)
        return
    if warm is not None:
        warm()
    order = list(range(len(tasks))) if order is None else list(order)
    import multiprocessing     # (~9 ms to import: only for local processes)
    if "fork" in multiprocessing.get_all_start_methods():
        run_forked(function, tasks, order, jobs, record)
        return
    from concurrent.futures import ProcessPoolExecutor
    # small chunks: tasks differ a hundredfold in cost, and a worker left with a long
    # chunk at the end keeps the others idle (one round trip costs well under a task)
    chunk = max(1, len(tasks) // (64 * jobs))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        done = pool.map(function, [tasks[index] for index in order], chunksize=chunk)
        for count, (index, result) in enumerate(zip(order, done), 1):
            record(index, result, count)


def run_forked(run, tasks, order, jobs, record):
    """Run ``tasks`` in ``order`` here and on ``jobs - 1`` processes forked from here.

    Every process takes the next task from one shared counter, so the long tasks
    (first in ``order``) spread and no process idles while another has several
    left. This process works too: it holds the presets and cost models the forked
    ones inherit, and it spares a worker's start and the round trips of a pool
    (whose workers wait between tasks for the next to be handed over). The forked
    processes send each task's rows as they finish; they are recorded between this
    process's own tasks. A forked process that fails raises here.
    """
    import multiprocessing
    import pickle
    import queue
    import signal
    context = multiprocessing.get_context("fork")
    counter = context.Value("l", 0)
    finished = context.Queue()

    def take():
        with counter.get_lock():
            position = counter.value
            counter.value = position + 1
        return order[position] if position < len(order) else None

    parent = os.getpid()

    def work(worker):   # in a forked process; its last message says it ended, and how
        # the parent's terminate() ends it at once (the parent's SIGTERM handler, which
        # the fork inherited, would run its finally clauses instead); and it stops taking
        # tasks when the parent is gone (killed, say), instead of working on alone
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent handles ^C for both
        try:
            while os.getppid() == parent and (index := take()) is not None:
                finished.put((index, run(tasks[index])))
        except BaseException as error:  # noqa: BLE001 - raised again in the parent
            try:
                pickle.dumps(error)
            except Exception:   # noqa: BLE001 - an error that cannot travel as it is
                error = RuntimeError(f"{type(error).__name__}: {error}")
            finished.put((None, (worker, error)))
        else:
            finished.put((None, (worker, None)))

    done = 0
    children = [context.Process(target=work, args=(worker,), daemon=True)
                for worker in range(jobs - 1)]
    ended = set()

    def receive(timeout):
        nonlocal done
        try:
            index, rows = finished.get(timeout=timeout)
        except queue.Empty:
            return False
        if index is None:
            worker, error = rows
            ended.add(worker)
            if error is not None:
                raise error
        else:
            done += 1
            record(index, rows, done)
        return True

    try:
        for child in children:
            child.start()
        while (index := take()) is not None:
            rows = run(tasks[index])
            done += 1
            record(index, rows, done)
            while receive(0):       # what the others finished meanwhile
                pass
        while len(ended) < len(children):
            gone = [worker for worker, child in enumerate(children)
                    if child.exitcode is not None and worker not in ended]
            # a process that exited has sent all it will: if its last message is not
            # in transit either, it died in the middle of a task
            if not receive(0.1) and gone and not receive(0.1):
                raise TabschedError(f"a worker process died (exit status "
                                    f"{children[gone[0]].exitcode}); run with -j 1 to "
                                    f"see why")
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
            child.join()


def run_dask(run, tasks, dask, jobs, record):
    """Run ``tasks`` on Dask: a scheduler address, ``"local"`` (a LocalCluster of
    ``jobs`` single-threaded workers, closed after) or a Client; ``record`` as the
    results come."""
    distributed = require("distributed", "dask", "--dask")
    Client, LocalCluster, as_completed = (distributed.Client, distributed.LocalCluster,
                                          distributed.as_completed)
    owned = []
    if isinstance(dask, Client):
        client = dask
    elif dask == "local":
        cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, dashboard_address=None)
        client = Client(cluster)
        owned = [client, cluster]
    else:
        _check_address(distributed, dask)
        try:
            client = Client(dask, timeout="10s")
        except (OSError, TimeoutError, ValueError, TypeError) as error:   # a bad address too
            raise InvalidParameterError(f"--dask {dask}: cannot reach the scheduler "
                                        f"({error})") from None
        owned = [client]
    try:
        futures = client.map(run, tasks, pure=False)
        index_of = {future.key: index for index, future in enumerate(futures)}
        for done, future in enumerate(as_completed(futures), 1):
            record(index_of[future.key], future.result(), done)
    finally:
        for resource in owned:
            resource.close()


def _check_address(distributed, dask):
    """Refuse a scheduler address that names no host and port before any connection
    (``Client`` would start its event loop thread first: under load, that fails on its
    own and says nothing about the address)."""
    if not isinstance(dask, str):
        raise InvalidParameterError(f"--dask: a scheduler address, 'local' or a Client, not "
                                    f"{type(dask).__name__}")
    try:
        from distributed.comm.addressing import parse_address, parse_host_port
    except ImportError:     # another layout of distributed: Client says what is wrong
        return
    try:
        protocol, location = parse_address(dask)
        if protocol in ("tcp", "tls", "ucx", "ws", "wss"):
            parse_host_port(location)
    except (ValueError, TypeError) as error:
        raise InvalidParameterError(f"--dask {dask}: cannot reach the scheduler "
                                    f"({error})") from None
