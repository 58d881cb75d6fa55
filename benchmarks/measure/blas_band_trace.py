"""Where a two-GPU band call's time goes, item by item: each of ``--routines`` (zgemmt A^H B, zherk A A^H, zher2k;
lower) with host operands runs ``--calls`` calls after three warm-up calls (page-locked by then) with
devices.cuda_bands.TRACE on; the last call's timeline on each GPU (every upload, peer copy, product and write-back,
with when its host thread queued it) is written beside the model's timeline of the same layout
(band_outer.simulate at the rates the layout was made for), and drawn as one row of bars per stream and GPU:
uploads, peer copies, products (diagonal blocks darker) and write-backs, the model's products under them. A
product queued after its GPU could have started it is one the host held back.

    python3 -m benchmarks.blas band-trace --sizes 8192 --routines zgemmt zherk --json out.json --plot out.png
"""
import datetime
import platform

import numpy as np

import hybridblas as hb
from hybridblas import band_outer, host_pinning
from hybridblas.console import check_output_path, positive_int

from benchmarks.common import command_line, gpu_sync, refuse, two_gpus, write_json
from benchmarks.measure.blas_gpu import call_hybrid, make_host, operands, timed


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[8192], help="n = k of each run")
    ap.add_argument("--routines", nargs="+", default=["zgemmt"], choices=["zgemmt", "zherk", "zher2k"],
                    help="routines traced at each size")
    ap.add_argument("--calls", type=positive_int, default=4, help="traced calls after three warm-up calls")
    ap.add_argument("--json", metavar="PATH", help="write the timelines here as JSON")
    ap.add_argument("--plot", metavar="PATH", help="draw the last call's timeline of each run here (PNG; the "
                                                  "routine and size go into the name where there are several)")


def summary(timeline, open_s):
    """Per GPU timeline (cuda.last_stats' "timeline"): products queued after their start on the GPU ("late", and
    by how much in all), busy seconds of products, first product's start and last write's end (GPU seconds)."""
    products = [r for r in timeline if r[0].startswith("product")]
    late = [max(0.0, (r[4] - open_s) - r[2]) for r in products]
    writes = [r for r in timeline if r[0] == "write"]
    return {"products": len(products), "late": sum(x > 0 for x in late), "late_s": round(sum(late), 6),
            "busy_s": round(sum(r[3] - r[2] for r in products), 6),
            "first_product_s": products[0][2] if products else None,
            "last_write_end_s": writes[-1][3] if writes else None}


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    if args.plot:
        check_output_path(args.plot, "--plot")
    cp = two_gpus("band-trace")
    from hybridblas.devices import cuda_bands
    from hybridblas.devices.cuda import CUDADevice, last_stats
    ctx = hb.Context(devices=[CUDADevice(0), CUDADevice(1)])
    doc = {"benchmark": "bench_band_trace", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": command_line(), "host": platform.node(),
           "gpus": [cp.cuda.runtime.getDeviceProperties(g)["name"].decode() for g in (0, 1)], "results": []}
    seen = {}
    made = cuda_bands._layout

    def spy(problem, devices, rates, context, **kw):     # the layout each call takes, and the rates of the call
        lay, shared, speeds = made(problem, devices, rates, context, **kw)
        if lay is not None:
            seen.update(layout=lay, speeds=list(speeds), h2d=cuda_bands._rate(context, devices, "h2d_pinned"),
                        d2h=cuda_bands._rate(context, devices, "d2h_pinned"))
        return lay, shared, speeds

    cuda_bands._layout = spy
    try:
        for n in args.sizes:
            for routine in args.routines:
                doc["results"].append(_one(cp, ctx, routine, n, args.calls, seen, last_stats, cuda_bands))
                write_json(args.json, doc)
    finally:
        cuda_bands._layout = made
        cuda_bands.TRACE = False
    if args.plot:
        for row in doc["results"]:
            name = f"-{row['n']}" if len(args.routines) == 1 else f"-{row['routine']}-{row['n']}"
            path = args.plot if len(doc["results"]) == 1 else args.plot.replace(".png", f"{name}.png")
            plot(row, path)
    return 0


def _one(cp, ctx, routine, n, calls, seen, last_stats, cuda_bands):
    a, b = make_host(cp, (n, n), 1), make_host(cp, (n, n), 2)
    c = np.zeros((n, n), np.complex128, order="F")
    host_args, kw = operands(routine, a, b)
    host_pinning.clear()
    try:
        for _ in range(3):
            call_hybrid(routine, host_args, kw, c, ctx)
        host_pinning.wait_ready()
        cuda_bands.TRACE = True
        seconds = timed(lambda: call_hybrid(routine, host_args, kw, c, ctx), gpu_sync(cp, (0, 1)), calls)
        cuda_bands.TRACE = False
        stats = {g: last_stats.get(f"cuda:{g}", {}) for g in (0, 1)}
        if any(st.get("path") != "bands" or "timeline" not in st for st in stats.values()):
            refuse(f"{routine} n = {n} did not take the band path on both GPUs: no timeline")
        lay = seen["layout"]
        model = []
        modelled = band_outer.simulate(lay, seen["speeds"], seen["h2d"], seen["d2h"], trace=model)
    finally:
        host_pinning.clear()
    row = dict(routine=routine, n=n, k=n, calls_s=seconds, order=lay.order, modelled_s=modelled,
               speeds=seen["speeds"], h2d=seen["h2d"], d2h=seen["d2h"], model=model, gpus={})
    for g in (0, 1):
        st = stats[g]
        keep = ("wall_s", "host_open_s", "host_first_upload_s", "host_first_product_s", "kernel_s", "lead_s",
                "gaps_s", "tail_s", "blocks", "upload_gbps", "writeback_gbps", "host_marks")
        row["gpus"][g] = dict({k: st.get(k) for k in keep}, timeline=st["timeline"],
                              summary=summary(st["timeline"], st["host_open_s"]))
    _print(row)
    return row


def _print(row):
    print(f"== {row['routine']} n = k = {row['n']}: calls {', '.join(f'{t * 1e3:.1f}' for t in row['calls_s'])} ms; "
          f"the model {row['modelled_s'] * 1e3:.1f} ms", flush=True)
    for g, r in row["gpus"].items():
        s = r["summary"]
        print(f"  GPU {g}: wall {r['wall_s'] * 1e3:.1f} ms, products {s['busy_s'] * 1e3:.1f} ms busy, first at "
              f"{s['first_product_s'] * 1e3:.2f} ms; {s['late']} of {s['products']} products queued after the GPU "
              f"could start them ({s['late_s'] * 1e3:.2f} ms in all); last write-back ends at "
              f"{s['last_write_end_s'] * 1e3:.2f} ms", flush=True)


LANES = ("upload", "peer", "product", "write", "model")
COLOURS = {"upload": "tab:blue", "peer": "tab:cyan", "product-rect": "tab:green", "product-diag": "darkgreen",
           "write": "tab:orange", "model": "tab:gray"}


def plot(row, path):
    """One row of bars per GPU and lane (uploads, peer copies, products, write-backs, the model's products)."""
    from benchmarks.plotting import pyplot, save
    plt = pyplot(required=True)
    fig, ax = plt.subplots(figsize=(11, 4.2))
    labels, y = [], 0
    for g in (0, 1):
        timeline = row["gpus"][g]["timeline"] if g in row["gpus"] else row["gpus"][str(g)]["timeline"]
        model = [(s, e) for slot, what, _i, s, e in row["model"] if int(slot) == g and what == "compute"]
        for lane in LANES:
            if lane == "model":
                bars = [(s, e, COLOURS["model"]) for s, e in model]
            else:
                bars = [(r[2], r[3], COLOURS["product-diag" if r[0].endswith("diag") else "product-rect"]
                         if lane == "product" else COLOURS[lane]) for r in timeline if r[0].startswith(lane)]
            ax.broken_barh([(s * 1e3, (e - s) * 1e3) for s, e, _ in bars], (y - 0.4, 0.8),
                           facecolors=[col for *_, col in bars], edgecolor="white", linewidth=0.3)
            labels.append(f"GPU {g} {lane}")
            y += 1
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the GPU's first event in the call")
    ax.set_title(f"{row['routine']} n = k = {row['n']}, host operands, 2 GPUs: last call "
                 f"{row['calls_s'][-1] * 1e3:.1f} ms (model {row['modelled_s'] * 1e3:.1f} ms)")
    return save(fig, path)
