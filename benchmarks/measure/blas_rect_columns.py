"""The rectangles of a two-GPU zgemmt corner-order call (A^H B, lower, n = k; laid out as benchmarks.blas
layout-build does, at rates near two H100s') alone on one GPU, device operands: each as one cuBLAS call and as
calls of about ``--columns`` columns (devices.cuda_bands.queue_product, as the band call queues them), best of
``--repeats``; per width, the rectangles' summed time and TF/s.

    python3 -m benchmarks.blas rect-columns --sizes 16384 --columns 0 512 640 768 1024 --json out.json
"""
from hybridblas import band_plan
from hybridblas.console import check_output_path, positive_int

from benchmarks.common import gpus_or_refuse, one_gpu_doc, refuse, write_json
from benchmarks.measure.blas_herkx_widths import DeviceGemmt
from benchmarks.measure.blas_layout_build import problem as host_problem


def add_arguments(ap):
    ap.add_argument("--sizes", nargs="+", type=positive_int, default=[16384], help="n = k of each call")
    ap.add_argument("--columns", nargs="+", type=int, default=[0, 512, 640, 768, 1024],
                    help="widths of the cuBLAS calls (0: one call per rectangle)")
    ap.add_argument("--repeats", type=positive_int, default=3, help="timed runs per width (the best is kept)")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


def rectangles(n, sms=132):
    """(GPU slot, i0, i1, j0, j1) of every rectangle of the corner-order layout of zgemmt n = k on two GPUs."""
    prob = host_problem("zgemmt", n)
    speeds, d2h, h2d = [50e12, 53e12], 30e9, 45e9
    lay = band_plan.BandLayout(prob, speeds, d2h, h2d, speeds=speeds, order="outer", sms=sms)
    return [(g, t.i0, t.i1, t.j0, t.j1) for g, blocks in enumerate(lay.blocks) for blk in blocks for t in blk
            if not t.diag]


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    bad = [w for w in args.columns if w < 0]
    if bad:
        refuse(f"--columns must be 0 or more, got {bad[0]}")
    cp, _ = gpus_or_refuse("rect-columns")
    doc = one_gpu_doc(cp, "bench_rect_columns")
    with cp.cuda.Device(0):
        for n in args.sizes:
            doc["results"].append(_one(cp, n, rectangles(n, doc["sms"]), args.columns, args.repeats))
            write_json(args.json, doc)
            cp.get_default_memory_pool().free_all_blocks()
    return 0


def _one(cp, n, rects, widths, repeats):
    run = DeviceGemmt(cp, n, n, n)
    rows, totals, flops = [], {}, 0.0
    for g, i0, i1, j0, j1 in rects:
        task = run.task(i0, i1, j0, j1)
        flops += task.flops
        row = {"gpu": g, "rows": i1 - i0, "columns": j1 - j0, "tflops": {}}
        for w in widths:
            t = run.best(task, repeats, columns=w)
            row["tflops"][w] = round(task.flops / t / 1e12, 2)
            totals[w] = totals.get(w, 0.0) + t
        rows.append(row)
        print(f"n = {n}  GPU {g}  {i1 - i0:5d} x {j1 - j0:5d}: "
              + "  ".join(f"{w or 'one'}: {v:5.1f}" for w, v in row["tflops"].items()) + " TF/s", flush=True)
    summary = {w: {"s": round(t, 5), "tflops": round(flops / t / 1e12, 2)} for w, t in totals.items()}
    for w, v in summary.items():
        print(f"n = {n}  every rectangle, {('calls of ' + str(w) + ' columns') if w else 'one call each'}: "
              f"{v['s'] * 1e3:8.2f} ms {v['tflops']:5.1f} TF/s", flush=True)
    return {"n": n, "k": n, "rectangles": rows, "total": summary}
