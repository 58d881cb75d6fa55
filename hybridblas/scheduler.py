"""Plan a call and run it on the context's devices: static split, dynamic queues, or one thread (sync).

This module decides which devices take part and what each gets (``static_assignment``, ``dynamic_tasks``);
``engine.Engine`` runs the tasks, one worker per device, and survives a device that fails.
"""
from . import blas_threads, plan
from .engine import Engine
from .triangle import reduce_partials


def execute(problem, ctx):
    available = ctx.devices_for(problem)
    rates = [ctx.rate(d, problem) for d in available]
    devices, rates = _without_idle_cpus(available, rates, ctx.min_cpu_share(available))
    devices, rates = _one_device_if_small(problem, devices, rates, ctx)
    reserves = [d for d in available if d not in devices]
    problem.extra.setdefault("memory_limit", getattr(ctx, "memory_limit", None))
    problem.extra.setdefault("pin_host", getattr(ctx, "pin_host", False))
    problem.extra["rates"] = {d.name: r for d, r in zip(devices, rates)}
    if len(devices) == 1 and devices[0].kind == "cuda":
        from .devices import cuda_inline
        if cuda_inline.applies(problem, devices[0]):
            cuda_inline.run(problem, devices[0])
            return "inline"
    if problem.fxp.__name__ == "cupy":
        problem.extra["caller_events"] = _caller_events(problem)
    strategy = ctx.resolve_strategy(devices)
    with blas_threads.limit(ctx.blas_threads(devices)):
        if strategy == "static":
            engine = Engine(problem, ctx, devices, rates, queues=static_assignment(problem, devices, rates, ctx),
                            reserves=reserves)
        else:
            engine = Engine(problem, ctx, devices, rates, pending=dynamic_tasks(problem, devices, ctx),
                            reserves=reserves)
        partials = engine.run(sync=ctx.sync)
    if partials:
        reduce_partials(problem, partials)
    return strategy


def _caller_events(problem):
    """An event on the caller's current stream of every GPU holding an operand: the device runs work on
    their own non-blocking streams, which must not start before the caller's queued work (e.g. the CuPy
    kernels that produced A, or the copies the normalisation made) has finished."""
    import cupy
    events = []
    held = [x for x in [problem.c] + [f.base for f in problem.factors] if type(x).__module__.startswith("cupy")]
    for gpu in sorted({x.device.id for x in held}):
        with cupy.cuda.Device(gpu):
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(cupy.cuda.get_current_stream())
            events.append(ev)
    return events


# ---------------------------------------------------------------- planning

def _without_idle_cpus(devices, rates, min_share):
    """Drop the CPU workers when beside accelerators their share of the rate is below ``min_share``:
    their tiles would arrive last, and their cores are better spent staging host data for the GPUs."""
    cpu = [i for i, d in enumerate(devices) if d.kind == "cpu"]
    if not cpu or len(cpu) == len(devices):
        return devices, rates
    if sum(rates[i] for i in cpu) >= min_share * sum(rates):
        return devices, rates
    keep = [i for i in range(len(devices)) if i not in cpu]
    return [devices[i] for i in keep], [rates[i] for i in keep]


TRANSFER_RATE = 25e9     # bytes/s to move operands to a device that does not hold them, where no profile measured it
REMOTE_LATENCY = 1e-4    # s: streams, staging and the copy back on a device that does not hold the data


def _transfer_rate(problem, device, ctx):
    """bytes/s at which the operands reach ``device``, which does not hold them: the profile's pinned
    host-to-GPU rate of that GPU for host operands, the pinned GPU-to-host rate of their GPU for a CPU worker;
    TRANSFER_RATE where the profile has none, and between GPUs (profiles do not measure those copies)."""
    if problem.fxp.__name__ == "numpy":
        gpu, key = device.name, "h2d_pinned"
    elif device.kind == "cpu":
        gpu, key = f"cuda:{_home_gpu(problem)}", "d2h_pinned"
    else:
        return TRANSFER_RATE
    prof = ctx.profile
    measured = prof.transfer(gpu) if prof is not None else None
    return (measured or {}).get(key, TRANSFER_RATE)


def _home_gpu(problem):
    """The GPU that holds the operands of a call on GPU operands (C's where C is on a GPU too)."""
    return (problem.c if problem.operand_xp is None else problem.factors[0].base).device.id


def _one_device_if_small(problem, devices, rates, ctx):
    """Calls too short to share run on one device: the one that finishes first once the operands'
    trip to a device that does not hold them is counted (tiny Gram matrices stay where their data is)."""
    if len(devices) == 1 or ctx.block_size or ctx.min_call_seconds <= 0:
        return devices, rates
    flops = problem.flops()
    if flops / max(rates) >= ctx.min_call_seconds:
        return devices, rates
    if problem.fxp.__name__ == "numpy":
        home = {i for i, d in enumerate(devices) if d.kind == "cpu"}
    else:
        home = {i for i, d in enumerate(devices) if d.name == f"cuda:{_home_gpu(problem)}"}
    moved = problem.c.nbytes + sum({id(f.base): f.base.nbytes for f in problem.factors}.values())
    cost = [flops / r + (0.0 if i in home else REMOTE_LATENCY + moved / _transfer_rate(problem, devices[i], ctx))
            for i, r in enumerate(rates)]
    i = min(range(len(devices)), key=cost.__getitem__)
    return [devices[i]], [rates[i]]


def static_assignment(problem, devices, rates, ctx):
    """Tasks per device: contiguous bands (or k ranges) whose flops follow the devices' rates."""
    nb = ctx.block_size
    if len(devices) == 1:
        tasks = [plan.whole(problem)]
        return [_retile(problem, tasks, nb)]
    if plan.wants_split_k(problem, len(devices)):
        bounds = plan.band_edges(problem.k, rates, triangular=False)
        out = []
        for k0, k1 in zip(bounds, bounds[1:]):
            t = plan.whole(problem)
            out.append([plan.Task(t.i0, t.i1, t.j0, t.j1, k0, k1,
                                  problem.tile_flops(t.i1, t.j1, k1 - k0, diag=t.diag), t.diag, True)]
                       if k1 > k0 else [])
        return out
    # GPUs take the leading bands (they need the fewest panels of the factors), the CPU the last one.
    order = sorted(range(len(devices)), key=lambda i: devices[i].kind == "cpu")
    size = problem.n
    edges = plan.band_edges(size, [rates[i] for i in order], problem.triangular)
    out = [[] for _ in devices]
    for pos, i in enumerate(order):
        out[i] = _retile(problem, plan.band(problem, edges[pos], edges[pos + 1]), nb)
    return out


def _retile(problem, tasks, nb):
    """Cut tasks into nb-sized tiles when the caller asked for a block size."""
    if not nb:
        return tasks
    out = []
    for t in tasks:
        for i0 in range(t.i0, t.i1, nb):
            for j0 in range(t.j0, t.j1, nb):
                i1, j1 = min(i0 + nb, t.i1), min(j0 + nb, t.j1)
                diag = t.diag and i0 == j0
                if t.diag and not diag and (i0 < j0 if problem.lower else i0 > j0):
                    continue
                out.append(plan.make_task(problem, i0, i1, j0, j1, t.k0, t.k1, diag=diag, split=t.split))
    return out


def dynamic_tasks(problem, devices, ctx):
    if plan.wants_split_k(problem, len(devices)):
        pieces = -(-problem.k // ctx.block_size) if ctx.block_size else 4 * len(devices)
        return plan.k_chunks(problem, max(1, pieces))
    nb = ctx.block_size_for(problem, devices) or min(d.preferred_block(problem) for d in devices)
    return plan.dynamic_order(problem, plan.tiles(problem, nb), ctx.tail_fraction)
