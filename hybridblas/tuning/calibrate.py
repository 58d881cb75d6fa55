"""Measure this node with hybridblas itself and build its profile (a plain dict, saved as YAML).

Per device (a single-device Context each) and per routine, dtype and size class: the flop rate on host
operands. Per device: the best tile edge for the dynamic strategy. Per GPU: host<->device copy rates,
pinned and pageable. With CPU and GPUs: the CPU's share of a static call, found by timing hybrid static
calls at the share the rates predict (and around it) against GPU-only, and whether the CPU helps at all.
"""
import datetime
import time
from dataclasses import dataclass, field

import hybridblas as hb

from .. import blas_threads
from ..context import Context
from ..devspec import gpu_count
from ..profile.model import BLOCK_SIZE_RANGE, FORMAT, interp_log
from ..profile.node import current_fingerprint, fingerprint_id, gpu_inventory
from ..profile.store import save_profile
from .measure import ROUTINES, Call, _operands, bench, combos, transfer_rates
from .progress import Progress

LADDER = {"cpu": (256, 512, 1024, 2048, 4096, 8192), "cuda": (1024, 2048, 4096, 8192, 16384)}
BLOCKS = {"cpu": (256, 512, 1024), "cuda": (1024, 2048, 4096)}


@dataclass
class Settings:
    """What a calibration measures; ``Settings.quick()`` and ``Settings.thorough()`` are the two modes."""
    mode: str = "thorough"
    routines: tuple = ROUTINES
    dtypes: tuple = ("float32", "float64", "complex64", "complex128")
    sizes: dict = field(default_factory=lambda: dict(LADDER))   # per device kind
    blocks: dict = field(default_factory=lambda: dict(BLOCKS))
    max_call_s: float = 3.0        # the ladder stops before a call predicted to take longer
    min_time: float = 0.5          # seconds of repetitions per measurement
    min_reps: int = 3
    block_sweep: str = "all"       # "all" routines, "first" routine/dtype only, or "none"
    share_factors: tuple = (0.0, 0.5, 0.75, 1.0, 1.25, 1.5)   # multiples of the predicted CPU share
    transfer_bytes: int = 256 << 20
    helps_margin: float = 0.02     # the CPU helps if hybrid beats GPU-only by more than this

    @classmethod
    def quick(cls):
        return cls(mode="quick", dtypes=("float64", "complex128"),
                   sizes={"cpu": (256, 1024, 4096), "cuda": (1024, 4096, 8192)},
                   max_call_s=0.4, min_time=0.05, min_reps=2, block_sweep="first",
                   share_factors=(1.0,), transfer_bytes=64 << 20)

    @classmethod
    def thorough(cls):
        return cls()

    def validate(self):
        bad = [r for r in self.routines if r not in ROUTINES]
        if bad:
            raise ValueError(f"routines must be among {ROUTINES}, got {bad}")
        if not combos(self.routines, self.dtypes):
            raise ValueError(f"no routine/dtype pair to measure in routines={self.routines}, dtypes={self.dtypes}")
        for kind, sizes in self.sizes.items():
            if not sizes or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in sizes):
                raise ValueError(f"sizes[{kind!r}] must be positive integers, got {sizes!r}")
        lo, hi = BLOCK_SIZE_RANGE
        for kind, blocks in self.blocks.items():
            if any(not isinstance(b, int) or isinstance(b, bool) or not lo <= b <= hi for b in blocks):
                raise ValueError(f"blocks[{kind!r}] must be integers in [{lo}, {hi}], got {blocks!r}")


def default_devices():
    return ["cpu"] + [f"cuda:{i}" for i in range(gpu_count())]


def _kind(name):
    return "cpu" if name.split("#")[0] == "cpu" else "cuda"


def _context(devices, **kw):
    # profile=False: never consult an existing profile while measuring
    return Context(devices=list(devices), profile=False, **kw)


def calibrate(devices=None, settings=None, show_progress=False):
    """Measure ``devices`` (default: the CPU and every GPU); return (profile dict, log records).

    ``show_progress``: a bar on stderr while it is a terminal (each step's result is logged at DEBUG)."""
    settings = settings or Settings.thorough()
    settings.validate()
    devices = list(devices or default_devices())
    for name in devices:
        Context(devices=[name], profile=False)      # ValueError now for an unknown device
    work = combos(settings.routines, settings.dtypes)
    gpus = [d for d in devices if _kind(d) != "cpu"]
    cpus = [d for d in devices if _kind(d) == "cpu"]
    n_blocks = len(devices) * (len(work) if settings.block_sweep == "all" else
                               (1 if settings.block_sweep == "first" else 0))
    total = len(devices) * len(work) + n_blocks + len(gpus) + (len(work) if gpus and cpus else 0)
    prog = Progress(total, enabled=show_progress)
    try:
        log, t_start = [], time.perf_counter()
        fp = current_fingerprint()
        names, _, _ = gpu_inventory()
        entries = {}
        for name in devices:
            kind = _kind(name)
            entry = {"kind": kind}
            if kind == "cpu":
                entry.update(model=fp["cpu_model"], threads=blas_threads.available_cores())
            else:
                idx = int(name.split(":")[1]) if ":" in name else 0
                entry["model"] = names[idx] if idx < len(names) else name
            entry["rates"] = _rates(name, kind, work, settings, prog, log)
            entry["block_size"] = _blocks(name, kind, work, entry["rates"], settings, prog, log)
            if kind != "cpu" and "model" in entry and names:
                entry["transfer"] = _transfer(name, settings, prog, log)
            entries[name] = entry
        data = {"format": FORMAT,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "hybridblas_version": hb.__version__, "mode": settings.mode,
                "fingerprint": dict(fp), "devices": entries}
        if gpus and cpus:
            data["static"] = _shares(cpus[0], gpus, work, entries, settings, prog, log)
        data["calibration"] = {"seconds": round(time.perf_counter() - t_start, 2), "devices": devices,
                               "routines": list(settings.routines), "dtypes": list(settings.dtypes)}
    finally:
        prog.close()
        _operands.cache_clear()        # the shared test matrices are gigabytes on a GPU node
    return data, log


def calibrate_to(directory=None, devices=None, settings=None, show_progress=False):
    """Calibrate and save: returns (profile path, log path, profile dict)."""
    import json
    data, log = calibrate(devices, settings, show_progress)
    path = save_profile(data, directory)
    log_path = path.with_name(fingerprint_id(data["fingerprint"]) + ".calibration.json")
    log_path.write_text(json.dumps({"fingerprint": data["fingerprint"], "mode": data["mode"],
                                    "created": data["created"], "records": log}, indent=1))
    return path, log_path, data


# ---------------------------------------------------------------- the steps

def _rates(name, kind, work, settings, prog, log):
    """{routine: {dtype: {n: flop/s}}} up the size ladder, stopping before calls grow too long."""
    ctx = _context([name], strategy="static")
    rates = {}
    for routine, dt in work:
        table, last = {}, None
        for n in settings.sizes.get(kind, LADDER[kind]):
            if last is not None and last[1] * (n / last[0]) ** 3 > settings.max_call_s:
                break
            call = Call(routine, n, dt)
            best, median, reps = bench(lambda: call.run(ctx), settings.min_time, settings.min_reps)
            table[n] = float(call.flops / best)
            last = (n, best)
            log.append({"step": "rate", "device": name, "routine": routine, "dtype": dt, "n": n,
                        "best_s": best, "median_s": median, "reps": reps, "flops": call.flops,
                        "gflops": call.flops / best / 1e9})
        rates.setdefault(routine, {})[dt] = table
        top = max(table)
        prog.step(f"{name} {routine} {dt}: {table[top] / 1e9:.1f} GFLOP/s at n={top}")
    return rates


def _blocks(name, kind, work, rates, settings, prog, log):
    """Best dynamic tile edge: sweep a few at the largest size measured for the routine."""
    if settings.block_sweep == "none":
        return {}
    todo = work if settings.block_sweep == "all" else work[:1]
    out = {}
    for routine, dt in todo:
        n = max(rates[routine][dt])
        candidates = ([b for b in settings.blocks.get(kind, BLOCKS[kind]) if 2 * b <= n]
                      or [max(BLOCK_SIZE_RANGE[0], n // 2)])
        call = Call(routine, n, dt)
        times = {}
        for nb in candidates:
            ctx = _context([name], strategy="dynamic", block_size=nb)
            best, median, reps = bench(lambda: call.run(ctx), settings.min_time, max(1, settings.min_reps - 1))
            times[nb] = best
            log.append({"step": "block", "device": name, "routine": routine, "dtype": dt, "n": n,
                        "block_size": nb, "best_s": best, "median_s": median, "reps": reps,
                        "gflops": call.flops / best / 1e9})
        nb = min(times, key=times.get)
        out.setdefault(routine, {})[dt] = nb
        out.setdefault("default", nb)
        prog.step(f"{name} {routine} {dt}: block {nb} (of {candidates}) at n={n}")
    return out


def _transfer(name, settings, prog, log):
    idx = int(name.split(":")[1]) if ":" in name else 0
    rates = transfer_rates(idx, settings.transfer_bytes, settings.min_time)
    log.append({"step": "transfer", "device": name, "bytes": settings.transfer_bytes, **rates})
    prog.step(f"{name} transfers GB/s: " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in rates.items()))
    return rates


def _interleaved(call, contexts, settings):
    """Best time of ``call`` under each context, the contexts taking turns (a drift of the node's clocks
    hits them alike): rounds until ``settings.min_time`` has passed per context and at least min_reps + 1."""
    for ctx in contexts.values():
        call.run(ctx)                                   # warm-up (and the host operands' pinning)
    times = {key: [] for key in contexts}
    start = time.perf_counter()
    rounds = 0
    while rounds < settings.min_reps + 1 or time.perf_counter() - start < settings.min_time * len(contexts):
        for key, ctx in contexts.items():
            t0 = time.perf_counter()
            call.run(ctx)
            times[key].append(time.perf_counter() - t0)
        rounds += 1
        if rounds >= 20:
            break
    return {key: min(t) for key, t in times.items()}


def _shares(cpu, gpus, work, entries, settings, prog, log):
    """The CPU's static share per routine/dtype: time GPU-only vs hybrid around the predicted share."""
    out = {}
    for routine, dt in work:
        n = min(max(entries[g]["rates"][routine][dt]) for g in gpus)
        g_rates = {g: interp_log(entries[g]["rates"][routine][dt], n) for g in gpus}
        g_sum = sum(g_rates.values())
        cpu_rate = interp_log(entries[cpu]["rates"][routine][dt], n)
        cores = blas_threads.available_cores()
        cpu_rate *= max(1, cores - len(gpus)) / cores      # in a hybrid call each GPU keeps a core
        seed = cpu_rate / (cpu_rate + g_sum)
        call = Call(routine, n, dt)
        # cpu_min_share=0, min_call_seconds=0: the split itself is what is measured, the scheduler must not
        # drop a CPU worth a few % or put a short call on one device
        contexts = {0.0: _context(gpus, strategy="static", rates=g_rates, min_call_seconds=0.0)}
        for f in settings.share_factors:
            s = min(0.95, seed * f)
            if s > 0:
                contexts[s] = _context([cpu] + gpus, strategy="static", cpu_min_share=0.0, min_call_seconds=0.0,
                                       rates=dict(g_rates, **{cpu: s / (1 - s) * g_sum}))
        trials = _interleaved(call, contexts, settings)     # {share: best seconds}, 0.0 = GPU-only
        t_gpu = trials.pop(0.0)
        best = min(trials, key=trials.get) if trials else seed
        t_best = trials.get(best, float("inf"))
        helps = t_best < t_gpu * (1 - settings.helps_margin)
        out.setdefault(routine, {}).setdefault(dt, {})[n] = {
            "cpu_share": float(best) if helps else 0.0, "cpu_helps": bool(helps),
            "predicted_share": float(seed), "gpu_only_s": t_gpu, "hybrid_s": t_best,
            "speedup": t_gpu / t_best if t_best else None}
        log.append({"step": "share", "routine": routine, "dtype": dt, "n": n, "cpu": cpu, "gpus": gpus,
                    "gpu_only_s": t_gpu, "trials": {float(s): t for s, t in trials.items()},
                    "predicted_share": seed, "cpu_share": best if helps else 0.0, "cpu_helps": helps})
        prog.step(f"{'+'.join([cpu] + gpus)} {routine} {dt}: CPU share {best if helps else 0:.3f} "
                  f"({'helps' if helps else 'does not help'}; x{t_gpu / t_best:.2f} vs GPU-only)")
    return out
