"""Which devices take part in a call, and how its work is cut: the scheduler's decisions, in one place.

    participants(problem, devices, rates, ctx)   # the CPU left out where it would only slow the GPUs down,
                                                 # one device for a call too short to share
    wants_split_k(problem, n_devices)            # tall-skinny Gram products: parallelism from k, not from C

The rates come from the context (explicit rates, the node's profile, or defaults); the cost of moving the operands
to a device that does not hold them from the profile's measured transfer rates (TRANSFER_RATE where it has none).
"""

__all__ = ["participants", "without_idle_cpus", "one_device_if_small", "transfer_rate", "home_gpu", "wants_split_k",
           "TRANSFER_RATE", "REMOTE_LATENCY", "HOST_SPLIT_SECONDS", "DEVICE_SPLIT_SECONDS"]


def participants(problem, devices, rates, ctx):
    """(devices, rates) that take part in ``problem`` out of the usable ``devices`` with their ``rates``."""
    devices, rates = without_idle_cpus(devices, rates, ctx.min_cpu_share(devices))
    return one_device_if_small(problem, devices, rates, ctx)


def wants_split_k(problem, n_devices):
    """Small C, huge inner dimension (Gram matrices of tall blocks): parallelism must come from k."""
    size = max(problem.m, problem.n)
    return n_devices > 1 and problem.k >= 8 * size and problem.k >= 2048


def without_idle_cpus(devices, rates, min_share):
    """Drop the CPU workers when beside accelerators their share of the rate is below ``min_share``:
    their tiles would arrive last, and their cores are better spent staging host data for the GPUs."""
    cpu = [i for i, d in enumerate(devices) if d.kind == "cpu"]
    if not cpu or len(cpu) == len(devices):
        return devices, rates
    if sum(rates[i] for i in cpu) >= min_share * sum(rates):
        return devices, rates
    keep = [i for i in range(len(devices)) if i not in cpu]
    return [devices[i] for i in keep], [rates[i] for i in keep]


# Host operands split over several GPUs lose to one GPU until a call is long: each GPU then waits for its
# panels (from the host, or from the GPU that brought them) and writes C back through its own staging. On
# 2 x H200 (benchmarks.blas gpu, steady state), at n = k = 4096 two GPUs took 16 ms for a zherk that one
# took in 12.7 (zher2k 20 % slower, zgemmt 13 %); at 8192 they were even (about 40 ms on one GPU), at 12288
# two GPUs were 1.3-1.5x faster. So a host-operand call that one GPU computes in under this many seconds
# runs on one GPU.
HOST_SPLIT_SECONDS = 0.04
# Device operands split with a peer GPU lose too while a call is short: on 2 x H200 at n = k = 4096 (one GPU
# 6-13 ms) zherk took 7.3 ms on two against 6.8 on one, zgemmt 9.5 against 6.6 (the peer's copies over NVLink,
# its streams and the write-back cost 4-6 ms); at 8192 (40-55 ms) two GPUs were 1.5-1.7x faster. On 2 x H100,
# n = 7011, k = 3136 (flapw's NaCl Kmax 3.5): zherk 11-17 ms split against 11 ms on one GPU, zher2k 19-25
# against 22, zherkx 14-54 against 11. So a call on GPU operands that one GPU computes in under this many
# seconds (at the profile's rate, or the default 40 TF/s) stays on one GPU.
DEVICE_SPLIT_SECONDS = 0.035
TRANSFER_RATE = 25e9     # bytes/s to move operands to a device that does not hold them, where no profile measured it
REMOTE_LATENCY = 1e-4    # s: streams, staging and the copy back on a device that does not hold the data


def transfer_rate(problem, device, ctx):
    """bytes/s at which the operands reach ``device``, which does not hold them: the profile's pinned
    host-to-GPU rate of that GPU for host operands, the pinned GPU-to-host rate of their GPU for a CPU worker;
    TRANSFER_RATE where the profile has none, and between GPUs (profiles do not measure those copies)."""
    if problem.fxp.__name__ == "numpy":
        gpu, key = device.name, "h2d_pinned"
    elif device.kind == "cpu":
        gpu, key = f"cuda:{home_gpu(problem)}", "d2h_pinned"
    else:
        return TRANSFER_RATE
    prof = ctx.profile
    measured = prof.transfer(gpu) if prof is not None else None
    return (measured or {}).get(key, TRANSFER_RATE)


def home_gpu(problem):
    """The GPU that holds the operands of a call on GPU operands (C's where C is on a GPU too)."""
    return (problem.c if problem.operand_xp is None else problem.factors[0].base).device.id


def one_device_if_small(problem, devices, rates, ctx):
    """Calls too short to share run on one device: the one that finishes first once the operands'
    trip to a device that does not hold them is counted (tiny Gram matrices stay where their data is).
    Short is ``ctx.min_call_seconds`` on the fastest device, and on GPUs alone HOST_SPLIT_SECONDS for host
    operands, DEVICE_SPLIT_SECONDS for GPU operands: a call never runs slower on several devices than on the
    best one of them."""
    if len(devices) == 1 or ctx.block_size or ctx.min_call_seconds <= 0:
        return devices, rates
    flops = problem.flops()
    host = problem.fxp.__name__ == "numpy"
    short = ctx.min_call_seconds
    if all(d.kind == "cuda" for d in devices):
        short = max(short, HOST_SPLIT_SECONDS if host else DEVICE_SPLIT_SECONDS)
    if flops / max(rates) >= short:
        return devices, rates
    if host:
        home = {i for i, d in enumerate(devices) if d.kind == "cpu"}
    else:
        home = {i for i, d in enumerate(devices) if d.name == f"cuda:{home_gpu(problem)}"}
    moved = problem.c.nbytes + sum({id(f.base): f.base.nbytes for f in problem.factors}.values())
    cost = [flops / r + (0.0 if i in home else REMOTE_LATENCY + moved / transfer_rate(problem, devices[i], ctx))
            for i, r in enumerate(rates)]
    i = min(range(len(devices)), key=cost.__getitem__)
    return [devices[i]], [rates[i]]
