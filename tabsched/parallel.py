"""Tasks run here, on forked local processes, on Dask or on any executor: what a sweep
and a plan share.

``tabsched sweep`` (``tabsched.sweeps.run_sweep``) and ``tabsched plan``
(``tabsched.plan.search``) hand their tasks to :func:`run_parallel` with a
``record(index, result, done)`` callback that receives each result as it comes (in
any order) and a count of the tasks done.

Given each task's ``weight`` (its work in any unit), :func:`run_parallel` first runs
the smallest tasks here for :data:`CALIBRATION_SECONDS`, which prices the unit; it
runs the rest here too when they would take less than what starting the workers
costs (:data:`START_SECONDS`, by kind); otherwise it sends them to other processes
in batches of at least :data:`BATCH_SECONDS` of work each, so that a task's round
trip (about 3.6 ms on Dask) is a small part of it.
"""

import os
import time

from tabsched._extras import require
from tabsched.exceptions import InvalidParameterError, TabschedError

__all__ = ["run_parallel", "run_forked", "run_dask", "run_executor", "BATCH_SECONDS",
           "START_SECONDS", "CALIBRATION_SECONDS"]

#: Work a batch sent to another process holds at least, in seconds: a Dask task costs
#: about 3.6 ms in scheduling and transfer whatever it does (issue 24's measurement),
#: 4% of this; a future of a process pool less.
BATCH_SECONDS = 0.1
#: Seconds of the smallest tasks run here to price a unit of ``weight``.
CALIBRATION_SECONDS = 0.05
#: Below twice these seconds of remaining (estimated) work the tasks run here: what
#: starting the workers costs before they gain anything, measured on this project's
#: 2-core machine. Forking a process that holds the presets and cost models, and
#: receiving its rows, is about 0.1 s for a sweep; a Dask cluster or an executor that
#: the caller started has its workers running, but the first batch each takes pays
#: for importing tabsched there (about 0.5 s); ``--dask local`` starts a cluster of
#: its own first and closes it after (about 3 s together).
START_SECONDS = {"fork": 0.1, "dask": 0.5, "dask-local": 3.0, "executor": 0.5}


def run_parallel(function, tasks, *, jobs=1, dask=None, executor=None, record, order=None,
                 warm=None, weight=None):
    """``record(index, function(tasks[index]), done)`` for every task: here, on ``jobs``
    local processes (this one and ``jobs - 1`` forked from it, each taking the next task
    from a shared counter), on Dask (``dask``: a scheduler address, ``"local"`` or a
    Client; the ``dask`` extra) or on ``executor`` (any ``concurrent.futures.Executor``:
    a process pool, loky's, mpi4py's, a Dask client's ``get_executor()``).
    ``function`` and the tasks must be picklable for Dask, for an executor of processes
    and where processes cannot fork; forked processes inherit this one's memos.

    ``order``: the order the tasks are taken in (default as given; a sweep puts its
    largest tables first); ``warm()``: run once before any process forks, so that
    each inherits what it builds (a sweep's presets and cost models). ``weight(task)``:
    a task's work in any unit (a sweep counts operations); with it, the tasks run here
    when the work is too small to gain from other processes, and go to Dask or an
    executor in batches of :data:`BATCH_SECONDS` (see the module's docstring). Without
    it every task is sent as it is (a plan sizes its own). Serially the tasks run as
    given.
    """
    tasks = list(tasks)
    if isinstance(jobs, bool) or not isinstance(jobs, int):
        raise InvalidParameterError(f"jobs must be a whole number >= 1, not {jobs!r}")
    if jobs < 1:
        raise InvalidParameterError(f"jobs must be >= 1, not {jobs}")
    if dask is not None and executor is not None:
        raise InvalidParameterError("give dask or executor, not both")
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise InvalidParameterError(f"executor: a concurrent.futures.Executor (with submit), "
                                    f"not {type(executor).__name__}")
    kind = ("dask-local" if isinstance(dask, str) and dask == "local"
            else "dask" if dask is not None else "executor" if executor is not None
            else "fork" if jobs > 1 else None)
    if kind is None:
        for index, task in enumerate(tasks):
            record(index, function(task), index + 1)
        return
    order = list(range(len(tasks))) if order is None else list(order)
    owned = []
    if kind == "dask":      # a scheduler named: reached (or refused) whatever the size
        dask, owned = _dask_client(dask, jobs)
    elif kind == "dask-local":
        require("distributed", "dask", "--dask")
    try:
        _run_parallel(function, tasks, jobs, dask, executor, record, order, warm, weight,
                      kind)
    finally:
        for resource in owned:
            resource.close()


def _run_parallel(function, tasks, jobs, dask, executor, record, order, warm, weight, kind):
    if warm is not None and kind == "fork":
        warm()
    done, unit = 0, None
    if weight is not None:
        done, order, unit = _calibrate(function, tasks, order, weight, record)
        left = unit * sum(weight(tasks[index]) for index in order)
        if left < 2 * START_SECONDS[kind]:
            for index in order:
                done += 1
                record(index, function(tasks[index]), done)
            return
    if not order:
        return
    counted = _Counted(record, done)
    if kind == "fork":
        import multiprocessing     # (~9 ms to import: only for local processes)
        if "fork" in multiprocessing.get_all_start_methods():
            run_forked(function, tasks, order, jobs, counted)
            return
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            run_executor(function, tasks, pool, counted,
                         _batches(tasks, order, weight, unit, jobs))
        return
    batches = _batches(tasks, order, weight, unit, _workers(executor, jobs))
    if kind == "dask-local":
        run_dask(function, tasks, dask, jobs, counted, batches)
    elif kind == "dask":
        _run_on_client(function, tasks, dask, counted, batches)
    else:
        run_executor(function, tasks, executor, counted, batches)


class _Counted:
    """``record`` with the count of tasks done going on from ``done``."""

    def __init__(self, record, done):
        self.record, self.done = record, done

    def __call__(self, index, result, _count):
        self.done += 1
        self.record(index, result, self.done)


def _calibrate(function, tasks, order, weight, record):
    """Run the smallest tasks here (the end of ``order``) until they have taken
    :data:`CALIBRATION_SECONDS` (one at least): ``(done, the order left, seconds per unit
    of weight)``."""
    order, done, spent, units = list(order), 0, 0.0, 0.0
    while order and (done == 0 or spent < CALIBRATION_SECONDS):
        index = order.pop()
        began = time.perf_counter()
        result = function(tasks[index])
        spent += time.perf_counter() - began
        units += max(float(weight(tasks[index])), 0.0)
        done += 1
        record(index, result, done)
    return done, order, (spent / units if units > 0 else 0.0)


def _batches(tasks, order, weight, unit, workers):
    """``order`` cut into runs of at least :data:`BATCH_SECONDS` of estimated work (a
    task each without a weight), and into at least four per worker where there is
    enough, so that the last ones to finish are short."""
    if weight is None or not unit:
        return [[index] for index in order]
    seconds = [unit * max(float(weight(tasks[index])), 0.0) for index in order]
    total = sum(seconds)
    size = max(BATCH_SECONDS, min(total / (4 * workers), 4 * BATCH_SECONDS))
    batches, current, held = [], [], 0.0
    for index, cost in zip(order, seconds):
        current.append(index)
        held += cost
        if held >= size:
            batches.append(current)
            current, held = [], 0.0
    if current:
        batches.append(current)
    return batches


def _workers(executor, jobs):
    """How many processes ``executor`` runs, where it says (else ``jobs``)."""
    count = getattr(executor, "_max_workers", None)
    return count if isinstance(count, int) and count > 0 else jobs


class Batch:
    """``function`` over a tuple of tasks: one task of Dask's or an executor's for many of
    tabsched's (picklable where ``function`` is)."""

    def __init__(self, function):
        self.function = function

    def __call__(self, tasks):
        return [self.function(task) for task in tasks]


def run_executor(run, tasks, executor, record, batches=None):
    """Run ``tasks`` on ``executor`` (a ``concurrent.futures.Executor``), one future per
    batch of indices (default one per task); ``record`` as the results come."""
    from concurrent.futures import as_completed
    batches = [[index] for index in range(len(tasks))] if batches is None else batches
    work = Batch(run)
    futures = {executor.submit(work, tuple(tasks[index] for index in batch)): batch
               for batch in batches}
    try:
        for done, future in enumerate(as_completed(futures), 1):
            for index, result in zip(futures[future], future.result()):
                record(index, result, done)
    finally:
        for future in futures:
            future.cancel()


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


def run_dask(run, tasks, dask, jobs, record, batches=None):
    """Run ``tasks`` on Dask: a scheduler address, ``"local"`` (a LocalCluster of
    ``jobs`` single-threaded workers, closed after) or a Client; one Dask task per
    batch of indices (default one per task); ``record`` as the results come. Each
    worker imports ``run``'s module once first, all together, rather than the first
    batch each takes waiting for it."""
    client, owned = _dask_client(dask, jobs)
    try:
        _run_on_client(run, tasks, client, record, batches)
    finally:
        for resource in owned:
            resource.close()


def _dask_client(dask, jobs):
    """``(client, what to close after)`` for ``dask``."""
    distributed = require("distributed", "dask", "--dask")
    Client, LocalCluster = distributed.Client, distributed.LocalCluster
    if isinstance(dask, Client):
        return dask, []
    if isinstance(dask, str) and dask == "local":
        cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, dashboard_address=None)
        client = Client(cluster)
        return client, [client, cluster]
    _check_address(distributed, dask)
    try:
        client = Client(dask, timeout="10s")
    except (OSError, TimeoutError, ValueError, TypeError) as error:   # a bad address too
        raise InvalidParameterError(f"--dask {dask}: cannot reach the scheduler "
                                    f"({error})") from None
    return client, [client]


def _run_on_client(run, tasks, client, record, batches):
    from distributed import as_completed
    batches = [[index] for index in range(len(tasks))] if batches is None else batches
    module = getattr(run, "__module__", None)
    if module:
        try:
            client.run(_import, module)
        except Exception:   # noqa: BLE001 - a worker that cannot: its batch says why
            pass
    futures = client.map(Batch(run), [tuple(tasks[index] for index in batch)
                                      for batch in batches], pure=False)
    batch_of = {future.key: batch for future, batch in zip(futures, batches)}
    for done, future in enumerate(as_completed(futures), 1):
        for index, result in zip(batch_of[future.key], future.result()):
            record(index, result, done)


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


def _import(module):
    """Import ``module`` (on a Dask worker, before its first batch)."""
    import importlib
    importlib.import_module(module)
