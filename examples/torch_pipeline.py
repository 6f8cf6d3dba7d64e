"""Run tabsched tables with PyTorch's pipelining runtime, on CPU processes.

This is the bridge from a table to a real run. tabsched writes the table as
PyTorch's CSV (``tabsched convert ... --to csv`` or ``--to torch-comms``);
every rank builds its stages of one small transformer with
``torch.distributed.pipelining.PipelineStage``, loads the file with
``_PipelineScheduleRuntime._load_csv`` (the runtime that executes
compute_comms actions: with a compute_only file it adds UNSHARD/RESHARD,
REDUCE_GRAD and SEND/RECV itself) and calls ``step``. Ranks talk over gloo.

Used by ``tests/test_torch_execution.py`` (loss and gradients against one
process without a pipeline) and by ``examples/measure_vs_predict.py`` (measured
iteration times and a profiler trace per rank). It imports torch; tabsched
itself never does.

Run it by hand::

    tabsched convert zbv -p 2 -m 8 zbv.csv
    python examples/torch_pipeline.py zbv.csv            # 2 processes, loss vs one process
    python examples/torch_pipeline.py zbv.csv --iterations 3 --profile --out zbv-run
    tabsched eval zbv.csv --replay zbv-run/run.traces --samples 3

A job file lists several tables to run in one process group (``run_jobs``);
each rank writes ``<name>.rank<r>.pt`` with its losses, gradients and
iteration times, and, when asked, a profiler (Kineto) trace
``<name>.traces/rank<r>.json`` (what ``tabsched eval --replay <name>.traces`` reads).
"""

import argparse
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as functional
from torch import nn

HERE = pathlib.Path(__file__).resolve().parent


# ------------------------------------------------------------------ the model
@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A small decoder-only transformer, fp32, and the batch it trains on.

    ``microbatch_size`` sequences of ``sequence`` tokens make one microbatch;
    a batch of ``M`` microbatches is ``M * microbatch_size`` sequences.
    """

    layers: int = 8
    hidden: int = 64
    heads: int = 4
    sequence: int = 16
    vocabulary: int = 128
    microbatch_size: int = 2
    seed: int = 0


class Block(nn.Module):
    """Pre-norm transformer layer: causal self-attention, then a 4h GELU MLP."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.projection = nn.Linear(hidden, hidden)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        batch, sequence, hidden = x.shape
        qkv = self.qkv(self.attention_norm(x)).view(batch, sequence, 3, self.heads,
                                                    hidden // self.heads)
        query, key, value = qkv.permute(2, 0, 3, 1, 4)
        attended = functional.scaled_dot_product_attention(query, key, value, is_causal=True)
        x = x + self.projection(attended.transpose(1, 2).reshape(batch, sequence, hidden))
        return x + self.down(functional.gelu(self.up(self.mlp_norm(x))))


class Transformer(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm and the output layer."""

    def __init__(self, config):
        super().__init__()
        self.token_embedding = nn.Embedding(config.vocabulary, config.hidden)
        self.position_embedding = nn.Embedding(config.sequence, config.hidden)
        self.blocks = nn.ModuleList(Block(config.hidden, config.heads)
                                    for _ in range(config.layers))
        self.final_norm = nn.LayerNorm(config.hidden)
        self.output = nn.Linear(config.hidden, config.vocabulary)

    def forward(self, tokens):
        return StageModule(self, range(len(self.blocks)), first=True, last=True)(tokens)


class StageModule(nn.Module):
    """The part of a :class:`Transformer` one pipeline stage runs.

    Blocks are kept under their index in the whole model (``blocks.5.qkv.weight``),
    so a parameter has the same name in a stage as in the model.
    """

    def __init__(self, model, layers, *, first, last):
        super().__init__()
        self.token_embedding = model.token_embedding if first else None
        self.position_embedding = model.position_embedding if first else None
        self.blocks = nn.ModuleDict({str(layer): model.blocks[layer] for layer in layers})
        self.final_norm = model.final_norm if last else None
        self.output = model.output if last else None

    def forward(self, x):
        if self.token_embedding is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.token_embedding(x) + self.position_embedding(positions)
        for block in self.blocks.values():
            x = block(x)
        if self.output is not None:
            x = self.output(self.final_norm(x))
        return x


def build_model(config):
    """The model with the parameters the seed gives (the same on every rank)."""
    torch.manual_seed(config.seed)
    return Transformer(config)


def make_batch(config, microbatches):
    """Tokens and next-token targets of one batch, drawn from the seed."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    tokens = torch.randint(config.vocabulary,
                           (microbatches * config.microbatch_size, config.sequence + 1),
                           generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_fn(logits, targets):
    """Mean cross-entropy over the tokens of a (micro)batch."""
    return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def reference(config, microbatches):
    """Loss and gradients of one process, no pipeline, the whole batch at once.

    With microbatches of equal size and ``scale_grads`` (PyTorch's default),
    the pipeline's loss (the mean of the microbatch losses) and gradients
    equal these up to the order of floating-point sums.
    """
    model = build_model(config)
    tokens, targets = make_batch(config, microbatches)
    loss = loss_fn(model(tokens), targets)
    loss.backward()
    return loss.item(), {name: parameter.grad.clone()
                         for name, parameter in model.named_parameters()}


def even_layers(layers, stages):
    """Layers per stage, as even as possible (earlier stages take the remainder)."""
    if layers < stages:
        raise ValueError(f"{layers} layers cannot fill {stages} stages")
    return [layers // stages + (1 if stage < layers % stages else 0) for stage in range(stages)]


# ------------------------------------------------------------------ jobs
def job_for(table, path, name, *, config=ModelConfig(), file_format="compute_only",
            iterations=1, warmup=0, profile=False, expect_error=False):
    """A job (a dict, JSON-safe) that runs ``table`` as written at ``path``.

    ``table`` is the :class:`tabsched.ScheduleTable` the file holds; the job
    takes its stage -> rank map and layer split from it. With ``expect_error``
    the ranks only load the file and record what PyTorch raises.
    """
    placement = table.placement()
    stages = table.num_stages
    layers = (list(table.stage_layers) if table.stage_layers is not None
              else even_layers(config.layers, stages))
    if sum(layers) != config.layers:
        raise ValueError(f"{name}: the table's stages hold {sum(layers)} layers, "
                         f"the model has {config.layers}")
    return {"name": name, "path": os.fspath(path), "format": file_format,
            "microbatches": table.num_microbatches, "ranks": table.num_devices,
            "stage_to_rank": [int(placement[stage][0]) for stage in range(stages)],
            "stage_layers": layers, "config": dataclasses.asdict(config),
            "iterations": iterations, "warmup": warmup, "profile": profile,
            "expect_error": expect_error}


def pingpong_job(name, *, config=ModelConfig(), repeats=50):
    """A job that times one activation (``microbatch_size x sequence x hidden``, fp32)
    going 0 -> 1 -> 0 ``repeats`` times; :func:`one_way_time` reads the result."""
    return {"name": name, "kind": "pingpong", "ranks": 2, "config": dataclasses.asdict(config),
            "repeats": repeats}


def one_way_time(results, job):
    """Median round trip over two: the time of one activation transfer, in seconds."""
    trips = sorted(results[job["name"], 0]["round_trips"])
    return trips[len(trips) // 2] / 2


def _pingpong(job, rank, out, group):
    config = ModelConfig(**job["config"])
    activation = torch.zeros(config.microbatch_size, config.sequence, config.hidden)
    peer = 1 - rank  # sub-groups hold ranks 0..k-1: group ranks are global ranks
    trips = []
    dist.barrier(group=group)
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        if rank == 0:
            dist.send(activation, peer, group=group)
            dist.recv(activation, peer, group=group)
        else:
            dist.recv(activation, peer, group=group)
            dist.send(activation, peer, group=group)
        trips.append(time.perf_counter() - start)
    torch.save({"name": job["name"], "rank": rank, "round_trips": trips},
               out / f"{job['name']}.rank{rank}.pt")


def _local_stages(job, rank):
    return [stage for stage, owner in enumerate(job["stage_to_rank"]) if owner == rank]


def _build_schedule(job, rank, model, group):
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    num_stages = len(job["stage_to_rank"])
    bounds = [0]
    for count in job["stage_layers"]:
        bounds.append(bounds[-1] + count)
    stages = []
    for stage in _local_stages(job, rank):
        module = StageModule(model, range(bounds[stage], bounds[stage + 1]),
                             first=stage == 0, last=stage == num_stages - 1)
        stages.append(PipelineStage(module, stage, num_stages, torch.device("cpu"),
                                    group=group))
    schedule = _PipelineScheduleRuntime(stages, job["microbatches"], loss_fn=loss_fn)
    schedule._load_csv(job["path"], format=job["format"])
    return schedule, stages


def _run_job(job, rank, out, group):
    config = ModelConfig(**job["config"])
    local = _local_stages(job, rank)
    result = {"name": job["name"], "rank": rank, "stages": local}
    if job["expect_error"]:
        # Only the loading: PyTorch validates and lowers the file before any
        # communication, so an error here cannot leave a peer waiting.
        try:
            _build_schedule(job, rank, build_model(config), group)
            result["error"] = None
        except Exception as error:  # PyTorch's own error, whatever its type
            result["error"] = f"{type(error).__name__}: {error}"
        torch.save(result, out / f"{job['name']}.rank{rank}.pt")
        return
    model = build_model(config)
    schedule, stages = _build_schedule(job, rank, model, group)
    if rank == 0:  # what the runtime executes, every rank's row, as _dump_csv writes it
        lowered = out / f"{job['name']}.lowered.csv"
        schedule._dump_csv(os.fspath(lowered), format="compute_comms")
        result["lowered"] = lowered.read_bytes().decode()
    tokens, targets = make_batch(config, job["microbatches"])
    args = (tokens,) if 0 in local else ()
    last = len(job["stage_to_rank"]) - 1
    times, losses = [], []

    def iteration():
        for stage in stages:
            stage.submod.zero_grad(set_to_none=True)
        losses.clear()
        dist.barrier(group=group)
        start = time.perf_counter()
        if last in local:
            schedule.step(*args, target=targets, losses=losses)
        else:
            schedule.step(*args)
        times.append((start, time.perf_counter()))

    for _ in range(job["warmup"]):
        iteration()
    times.clear()
    if job["profile"]:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(job["iterations"]):
                iteration()
        traces = out / f"{job['name']}.traces"
        traces.mkdir(exist_ok=True)
        profiler.export_chrome_trace(os.fspath(traces / f"rank{rank}.json"))
    else:
        for _ in range(job["iterations"]):
            iteration()
    result["losses"] = [loss.item() for loss in losses]
    result["grads"] = {name: parameter.grad.clone() for stage in stages
                       for name, parameter in stage.submod.named_parameters()
                       if parameter.grad is not None}
    result["times"] = times
    torch.save(result, out / f"{job['name']}.rank{rank}.pt")


def worker(rank, world, rendezvous, jobs, out):
    """One rank: join the gloo group of ``world`` ranks and run every job in order.

    A job for ``k < world`` ranks runs on ranks ``0..k-1`` in a sub-group; the
    others wait for it at a barrier.
    """
    torch.set_num_threads(1)  # ranks share the machine's cores; one thread each
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world)
    try:
        sizes = sorted({job["ranks"] for job in jobs})
        # new_group is collective: every rank creates every group, in one order
        groups = {size: dist.new_group(list(range(size))) if size < world
                  else dist.group.WORLD for size in sizes}
        for job in jobs:
            started = time.perf_counter()
            if rank < job["ranks"]:
                run = _pingpong if job.get("kind") == "pingpong" else _run_job
                run(job, rank, out, groups[job["ranks"]])
            dist.barrier()
            _log(f"rank {rank}: {job['name']} on {job['ranks']} ranks: "
                 f"{time.perf_counter() - started:.2f} s")
    finally:
        dist.destroy_process_group()


def _log(line):
    """One line in one write, so that the forked ranks' lines do not interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _launch(world, jobs_path, out):
    """Fork ``world`` ranks from this process, which imported torch once for all of them.

    Exits 1 as soon as a rank fails (killing the others, which would wait for it).
    """
    import multiprocessing

    import torch.distributed.pipelining  # noqa: F401  (the slow import, shared by the forks)

    jobs = json.loads(pathlib.Path(jobs_path).read_text())
    out = pathlib.Path(out)
    rendezvous = pathlib.Path(tempfile.mkdtemp(dir=out)) / "rendezvous"
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=worker, args=(rank, world, rendezvous, jobs, out))
             for rank in range(world)]
    for process in ranks:
        process.start()
    while any(process.exitcode is None for process in ranks):
        if any(process.exitcode not in (None, 0) for process in ranks):
            for process in ranks:
                if process.exitcode is None:
                    process.kill()
            break
        time.sleep(0.05)
    for process in ranks:
        process.join()
    failed = [rank for rank, process in enumerate(ranks) if process.exitcode != 0]
    if failed:
        print(f"ranks {failed} failed (exit codes "
              f"{[ranks[rank].exitcode for rank in failed]})", flush=True)
        sys.exit(1)


def run_jobs(jobs, out, *, timeout=120.0):
    """Run ``jobs`` on CPU processes; wait at most ``timeout`` seconds.

    One launcher process imports torch and forks as many ranks as the largest
    job needs; they run every job in order in one gloo process group (a job
    with fewer ranks in a sub-group). Returns ``{(name, rank): result}`` with
    what each rank saved. Raises ``RuntimeError`` with the log's tail if a rank
    fails, and ``TimeoutError`` (after killing every rank) past ``timeout``.
    """
    out = pathlib.Path(out).resolve()  # the rendezvous is a file:// URL: absolute
    out.mkdir(parents=True, exist_ok=True)
    world = max(job["ranks"] for job in jobs)
    jobs_path = out / "jobs.json"
    jobs_path.write_text(json.dumps(jobs))
    environment = dict(os.environ, GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                       OMP_NUM_THREADS="1")
    log_path = out / "ranks.log"
    with open(log_path, "w") as log:
        launcher = subprocess.Popen([sys.executable, os.fspath(pathlib.Path(__file__)), "--launch",
                                     str(world), os.fspath(jobs_path), os.fspath(out)],
                                    stdout=log, stderr=subprocess.STDOUT, env=environment,
                                    start_new_session=True)
        try:
            launcher.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)  # the launcher and its forked ranks
            launcher.wait()
            raise TimeoutError(f"{world} ranks did not finish {len(jobs)} jobs in "
                               f"{timeout:g} s:\n{_tail(log_path)}") from None
    if launcher.returncode != 0:
        raise RuntimeError(f"the ranks failed:\n{_tail(log_path)}")
    results = {}
    for job in jobs:
        for rank in range(job["ranks"]):
            results[job["name"], rank] = torch.load(out / f"{job['name']}.rank{rank}.pt",
                                                    weights_only=False)
    return results


def _tail(path, lines=40):
    return "\n".join(pathlib.Path(path).read_text(errors="replace").splitlines()[-lines:])


def gather(results, job):
    """The loss (mean over microbatches) and every parameter's gradient of one job's run."""
    losses, grads = [], {}
    for rank in range(job["ranks"]):
        result = results[job["name"], rank]
        losses.extend(result.get("losses", []))
        grads.update(result.get("grads", {}))
    loss = sum(losses) / len(losses) if losses else float("nan")
    return loss, grads


def main(argv=None):
    parser = argparse.ArgumentParser(description="Run a tabsched/PyTorch compute_only or "
                                     "compute_comms CSV on CPU processes and compare its loss "
                                     "and gradients with one process.")
    parser.add_argument("csv", help="the schedule (a compute_comms file if it has SEND/RECV)")
    parser.add_argument("--out", help="directory for results (default: a temporary one)")
    parser.add_argument("--iterations", type=int, default=1, help="steps to run (default 1)")
    parser.add_argument("--profile", action="store_true",
                        help="profile the steps: one trace per rank in OUT/run.traces/")
    arguments = parser.parse_args(argv)
    sys.path.insert(0, os.fspath(HERE.parent))
    from tabsched.pytorch import read_pytorch

    schedule = read_pytorch(arguments.csv)
    job = job_for(schedule.table, os.path.abspath(arguments.csv), "run",
                  file_format=schedule.format, iterations=arguments.iterations,
                  profile=arguments.profile)
    out = pathlib.Path(arguments.out or tempfile.mkdtemp(prefix="tabsched-torch-"))
    results = run_jobs([job], out)
    loss, grads = gather(results, job)
    expected_loss, expected = reference(ModelConfig(), job["microbatches"])
    worst = max(float((grads[name] - grad).abs().max() / grad.abs().max().clamp_min(1e-12))
                for name, grad in expected.items())
    print(f"loss {loss:.6f} (one process {expected_loss:.6f}); "
          f"largest relative gradient difference {worst:.2e}")
    per_rank = [results["run", rank]["times"] for rank in range(job["ranks"])]
    walls = [max(times[i][1] for times in per_rank) - min(times[i][0] for times in per_rank)
             for i in range(arguments.iterations)]
    print("iteration times: " + ", ".join(f"{wall * 1e3:.1f} ms" for wall in walls))
    if arguments.profile:
        print(f"profiler traces: {out.resolve() / 'run.traces'}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--launch":
        _launch(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main()
