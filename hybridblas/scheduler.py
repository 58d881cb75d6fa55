"""Plan a call and run it on the context's devices: static split, dynamic queues, or one thread (sync).

Host operands on GPUs whose memory holds them go by bands (devices.cuda_bands), everything else by tiles.

``policy`` decides which devices take part; this module what each gets (``static_assignment``,
``dynamic_tasks``); ``engine.Engine`` runs the tasks, one worker per device, and survives a device that fails.
"""
from . import blas_threads, plan, policy
from .engine import Engine
from .triangle import reduce_partials


def execute(problem, ctx):
    available = ctx.devices_for(problem)
    rates = [ctx.rate(d, problem) for d in available]
    devices, rates = policy.participants(problem, available, rates, ctx)
    reserves = [d for d in available if d not in devices]
    problem.run.memory_limit = getattr(ctx, "memory_limit", None)
    problem.run.pin_host = getattr(ctx, "pin_host", False)
    problem.run.rates = {d.name: r for d, r in zip(devices, rates)}
    if getattr(ctx, "emulation", None) == "int8":
        problem.run.emulation = ctx.emulation_bits
    if len(devices) == 1 and devices[0].kind == "cuda":
        from .devices import cuda_direct, cuda_inline
        if cuda_inline.applies(problem, devices[0]):
            cuda_inline.run(problem, devices[0])
            return "inline"
        if cuda_direct.applies(problem, devices[0], ctx):
            cuda_direct.run(problem, devices[0])
            return "direct"
    from .devices import cuda_bands
    if cuda_bands.applies(problem, devices, rates, ctx) and cuda_bands.run(problem, devices, rates, ctx, reserves):
        return "bands"
    if problem.fxp.__name__ == "cupy":
        problem.run.caller_events = _caller_events(problem)
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
    held = [f.base for f in problem.factors] + ([problem.c] if problem.xp is problem.fxp else [])   # a host C: none
    for gpu in sorted({x.device.id for x in held}):
        with cupy.cuda.Device(gpu):
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(cupy.cuda.get_current_stream())
            events.append(ev)
    return events


# ---------------------------------------------------------------- planning

def static_assignment(problem, devices, rates, ctx):
    """Tasks per device: contiguous bands (or k ranges) whose flops follow the devices' rates."""
    nb = ctx.block_size
    if len(devices) == 1:
        tasks = [plan.whole(problem)]
        return [_retile(problem, tasks, nb)]
    if policy.wants_split_k(problem, len(devices)):
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
    if policy.wants_split_k(problem, len(devices)):
        pieces = -(-problem.k // ctx.block_size) if ctx.block_size else 4 * len(devices)
        return plan.k_chunks(problem, max(1, pieces))
    nb = ctx.block_size_for(problem, devices) or min(d.preferred_block(problem) for d in devices)
    return plan.dynamic_order(problem, plan.tiles(problem, nb), ctx.tail_fraction)
