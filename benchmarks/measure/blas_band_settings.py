"""Settings of the band path (host operands on several GPUs, hybridblas.devices.cuda_bands) side by side in one
process: each setting sets module constants of hybridblas.band_plan, band_outer, devices.cuda_bands or
devices.cuda_tri_store, and the same host operands run through it for ``--calls`` calls after two warm-up calls
(page-locked by then); ratios are to the sum of device-resident cuBLAS on each GPU alone, measured in the same
process. Each setting starts from a fresh layout cache; the GPUs' calibrated rates carry over, so a setting listed
twice shows the drift.

    python3 -m benchmarks.blas band-settings --sizes 8192 16384 --routines zherk zher2k \\
        --setting k band_plan.OUTER_GAIN=0 --setting outer band_plan.OUTER_GAIN=10 --calls 6 --json out.json

With ``--turns ROUNDS`` the settings take turns instead: each round switches to every setting in turn (reversed
every other round), makes one untimed call (the switch clears the layout cache) and ``--calls`` timed ones, so that
the machine's drift falls on all of them (2 x H100, zgemmt n = k = 16384: blocks of seven calls per setting gave
best calls 183-197 ms for the same setting within two minutes).

    python3 -m benchmarks.blas band-settings --sizes 16384 --routines zgemmt --turns 8 --calls 2 \
        --setting base --setting whole-triangle cuda_tri_store.PANEL=0 --json out.json

A setting is NAME followed by MODULE.CONSTANT=VALUE items (VALUE a Python literal); ``one-gpu`` as an item runs
that setting on the first GPU only.
"""
import ast
import datetime
import platform
import statistics

import numpy as np

import hybridblas as hb
from hybridblas import band_outer, band_plan, band_tail, host_pinning
from hybridblas.console import check_output_path, positive_int
from hybridblas.devices import cuda_bands, cuda_tri_store

from benchmarks.common import command_line, gpu_sync, refuse, two_gpus, write_json
from benchmarks.measure.blas_gpu import ROUTINES, call_device, call_hybrid, host_cases, timed

MODULES = {"band_plan": band_plan, "band_outer": band_outer, "band_tail": band_tail, "cuda_bands": cuda_bands,
           "cuda_tri_store": cuda_tri_store}
STATS = ("order", "steps", "blocks", "new_layout", "beside_build", "kernel_s", "lead_s", "gaps_s", "tail_s",
         "wall_s", "host_worker_s", "host_first_upload_s", "host_first_product_s", "kernels", "upload_gbps",
         "writeback_gbps", "given", "taken")


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[8192], help="n = k of each run")
    ap.add_argument("--routines", nargs="+", choices=ROUTINES, default=["zherk"])
    ap.add_argument("--setting", nargs="+", action="append", metavar="ITEM", default=None,
                    help="NAME [MODULE.CONSTANT=VALUE ...] [one-gpu]; repeat for each setting (default: the "
                         "defaults, twice)")
    ap.add_argument("--calls", type=positive_int, default=6, help="timed calls per setting; the best of all but "
                                                                     "the first is reported")
    ap.add_argument("--turns", type=positive_int, metavar="ROUNDS",
                    help="the settings take turns instead, ROUNDS rounds (in reverse order every other round), each "
                         "turn one untimed call after the switch and then --calls timed ones; reported: best and "
                         "median of all timed calls, and the median over the rounds of each setting's best call "
                         "over the first setting's in the same round")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


def parse_setting(items):
    """(name, {(module, constant): value}, one_gpu) of one --setting; ValueError naming a bad item."""
    name, values, one = items[0], {}, False
    for item in items[1:]:
        if item == "one-gpu":
            one = True
            continue
        key, sep, text = item.partition("=")
        module, dot, const = key.partition(".")
        if not sep or not dot or module not in MODULES or not hasattr(MODULES[module], const):
            raise ValueError(f"--setting item must be MODULE.CONSTANT=VALUE with MODULE one of {sorted(MODULES)} "
                             f"and an existing constant, got {item!r}")
        try:
            values[(module, const)] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ValueError(f"--setting value must be a Python literal, got {item!r}") from None
    return name, values, one


def set_constants(items):
    """Set the band path's constants of ``--set`` ``items`` (MODULE.CONSTANT=VALUE, as parse_setting reads them;
    refused with exit 2 otherwise); {"MODULE.CONSTANT": value} of what was set."""
    try:
        _, values, one = parse_setting(["set"] + list(items))
    except ValueError as exc:
        refuse(str(exc).replace("--setting", "--set"))
    if one:
        refuse("--set takes MODULE.CONSTANT=VALUE items only, got 'one-gpu'")
    for (module, const), value in values.items():
        setattr(MODULES[module], const, value)
    return {f"{m}.{c}": v for (m, c), v in values.items()}


def _timed(cp, fn, count):
    """Wall seconds of ``count`` calls of fn(), both GPUs synchronized around each (blas_gpu.timed)."""
    return timed(fn, gpu_sync(cp, (0, 1)), count)


def device_alone(cp, routine, host_args, n, g):
    """Best of three calls (after one) of device-resident cuBLAS on GPU g, the operands copied there."""
    def best():
        dev = tuple(x if np.isscalar(x) else cp.asarray(x, order="F") for x in host_args)
        dc = cp.empty((n, n), np.complex128, order="F")
        return min(_timed(cp, lambda: call_device(routine, dev, dc), 4)[1:])
    with cp.cuda.Device(g):
        out = best()
        cp.get_default_memory_pool().free_all_blocks()
    return out


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    try:
        settings = [parse_setting(s) for s in (args.setting or [["default"], ["default-again"]])]
    except ValueError as exc:
        refuse(str(exc))
    cp = two_gpus("band-settings")
    from hybridblas.devices.cuda import CUDADevice, last_stats
    ctx = {False: hb.Context(devices=[CUDADevice(0), CUDADevice(1)]), True: hb.Context(devices=[CUDADevice(0)])}
    defaults = {key: getattr(MODULES[key[0]], key[1]) for _, values, _ in settings for key in values}
    doc = {"benchmark": "bench_band_settings", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": command_line(), "host": platform.node(),
           "gpus": [cp.cuda.runtime.getDeviceProperties(g)["name"].decode() for g in (0, 1)], "results": []}

    def apply(values):
        band_plan.wait_rebuilds()       # no layout of the last setting's constants lands in the cleared cache
        for key, value in defaults.items():
            setattr(MODULES[key[0]], key[1], values.get(key, value))
        band_plan._cache.clear()
        last_stats.clear()

    def stats():
        return {gpu: {k: v for k, v in st.items() if k in STATS} for gpu, st in last_stats.items()}

    try:
        for n, routine, host_args, kw, c in host_cases(cp, args.sizes, args.routines):
            alone = [device_alone(cp, routine, host_args, n, g) for g in (0, 1)]
            ceiling = 1 / (1 / alone[0] + 1 / alone[1])
            print(f"== {routine} n = k = {n}: device cuBLAS {alone[0] * 1e3:.2f} / {alone[1] * 1e3:.2f} ms, "
                  f"sum of both {ceiling * 1e3:.2f} ms", flush=True)
            host_pinning.clear()
            for _ in range(2):
                call_hybrid(routine, host_args, kw, c, ctx[False])
            host_pinning.wait_ready()
            case = dict(routine=routine, n=n, device_alone_s=alone)
            if args.turns:
                _take_turns(cp, settings, args, case, apply, stats, ceiling, doc,
                            lambda one: call_hybrid(routine, host_args, kw, c, ctx[one]))
            else:
                for name, values, one in settings:
                    apply(values)
                    times = _timed(cp, lambda: call_hybrid(routine, host_args, kw, c, ctx[one]), args.calls)
                    _report(doc, case, name, values, one, times, min(times[1:] or times), ceiling, stats())
            write_json(args.json, doc)
    finally:
        for key, value in defaults.items():
            setattr(MODULES[key[0]], key[1], value)
    write_json(args.json, doc)
    return 0


def _report(doc, case, name, values, one, times, best, ceiling, stats, **extra):
    doc["results"].append(dict(case, setting=name, values={f"{m}.{k}": v for (m, k), v in values.items()},
                               one_gpu=one, seconds=times, best_s=best, ratio_to_sum=ceiling / best,
                               last_call=stats, **extra))
    print(f"  {name:16s} best {best * 1e3:9.2f} ms  {ceiling / best:.3f} of the sum  calls (ms) "
          f"{' '.join(f'{t * 1e3:.1f}' for t in times)}", flush=True)
    for gpu, st in stats.items():
        print(f"      {gpu}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" if k.endswith("_s") else f"{k} {v}"
                                         for k, v in st.items()), flush=True)


def _take_turns(cp, settings, args, case, apply, stats, ceiling, doc, call):
    """--turns: per round every setting in turn (reversed every other round), one untimed call after the switch
    and --calls timed ones; each setting's calls, best, median and its rounds' best over the first setting's."""
    times = [[] for _ in settings]
    bests = [[] for _ in settings]
    last = [None] * len(settings)
    for r in range(args.turns):
        order = list(range(len(settings)))
        for i in (order if r % 2 == 0 else order[::-1]):
            name, values, one = settings[i]
            apply(values)
            got = _timed(cp, lambda: call(one), args.calls + 1)[1:]
            times[i] += got
            bests[i].append(min(got))
            last[i] = stats()
    for i, (name, values, one) in enumerate(settings):
        paired = statistics.median(b / a for a, b in zip(bests[0], bests[i]))
        _report(doc, case, name, values, one, times[i], min(times[i]), ceiling, last[i],
                median_s=statistics.median(times[i]), paired_to_first=paired)
        print(f"      median {statistics.median(times[i]) * 1e3:.2f} ms, rounds' best over {settings[0][0]}'s: "
              f"median {paired:.3f}", flush=True)
