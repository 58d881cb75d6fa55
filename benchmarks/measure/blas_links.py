"""The links a band call moves its bytes over, page-locked host memory and GPU memory, GB/s per GPU: uploads
(host to GPU) on each GPU alone and on every GPU at once, write-backs (GPU to host) likewise, uploads and
write-backs on every GPU at once (as a band call overlaps them: ``--down-share`` of the upload's bytes go down),
and a peer copy between the first two GPUs. Best of ``--repeats``.

``--segments KIB ...``: the upload again on every GPU at once as 2D copies whose contiguous segments are that many
KiB (a band call's piece of a factor whose k runs along its rows: a stretch of rows of every column, the columns
128 KiB apart), alone and beside the write-back: the shares of a link's rate band_outer.SEGMENTS models.

    python3 -m benchmarks.blas links --gib 1 --down-share 0.25 --json out.json
    python3 -m benchmarks.blas links --segments 4 8 16 32 64 128 --json out.json
"""
import datetime
import platform
import time

from hybridblas.console import check_output_path, positive_float, positive_int

from benchmarks.common import command_line, gpus_or_refuse, refuse, write_json


def add_arguments(ap):
    ap.add_argument("--gib", type=positive_float, default=1.0, help="bytes each GPU uploads, GiB")
    ap.add_argument("--down-share", type=positive_float, default=0.25,
                    help="the write-back's bytes as a share of the upload's (zgemmt n = k on two GPUs: 0.25)")
    ap.add_argument("--repeats", type=positive_int, default=5, help="timed runs of each case (the best is kept)")
    ap.add_argument("--segments", nargs="+", type=positive_int, metavar="KIB", default=[],
                    help="also the upload as 2D copies of segments of these many KiB (each at most 128)")
    ap.add_argument("--json", metavar="PATH", help="write the results here as JSON")


def run(args):
    if args.json:
        check_output_path(args.json, "--json")
    if args.down_share > 1:
        refuse(f"--down-share must be at most 1, got {args.down_share}")
    if any(kib > PITCH >> 10 for kib in args.segments):
        refuse(f"--segments must be at most {PITCH >> 10} KiB each, got {args.segments}")
    cp, count = gpus_or_refuse("links", "GPUs")
    up_bytes = int(args.gib * 2**30)
    down_bytes = int(up_bytes * args.down_share)
    gpus = list(range(count))
    links = [_Link(cp, g, up_bytes, down_bytes) for g in gpus]
    doc = {"benchmark": "bench_links", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": command_line(), "host": platform.node(), "up_bytes": up_bytes, "down_bytes": down_bytes,
           "gpus": [cp.cuda.runtime.getDeviceProperties(g)["name"].decode() for g in gpus], "results": {}}

    def case(name, queue, nbytes):
        best = min(_timed(links, queue) for _ in range(args.repeats + 1))
        doc["results"][name] = {"s": round(best, 6), "GBps_per_gpu": round(nbytes / best / 1e9, 2)}
        print(f"{name:44s} {best * 1e3:8.2f} ms  {nbytes / best / 1e9:6.1f} GB/s per GPU", flush=True)

    for link in links:
        case(f"up, GPU {link.g} alone", [link.up], up_bytes)
    case("up, every GPU at once", [x.up for x in links], up_bytes)
    for link in links:
        case(f"down, GPU {link.g} alone", [link.down], down_bytes)
    case("down, every GPU at once", [x.down for x in links], down_bytes)
    case("up and down, every GPU at once", [f for x in links for f in (x.up, x.down)], up_bytes + down_bytes)
    for kib in args.segments:
        moved = links[0].segmented_bytes(kib << 10)
        case(f"up in {kib} KiB segments, every GPU at once", [lambda x=x: x.up_2d(kib << 10) for x in links], moved)
        case(f"up in {kib} KiB segments beside the write-back", [f for x in links for f in (
            lambda x=x: x.up_2d(kib << 10), x.down)], moved)
    if count > 1:
        with cp.cuda.Device(0):
            try:
                cp.cuda.runtime.deviceEnablePeerAccess(1)       # as a band call does (NVLink where there is one)
            except cp.cuda.runtime.CUDARuntimeError:            # already enabled, or no peer access
                pass
        case("peer, GPU 1 to GPU 0", [lambda: links[0].peer(links[1])], down_bytes)
    write_json(args.json, doc)
    return 0


def _timed(links, queue):
    for x in links:
        x.sync()
    t0 = time.perf_counter()
    for fn in queue:
        fn()
    for x in links:
        x.sync()
    return time.perf_counter() - t0


PITCH = 128 << 10          # bytes between the columns of --segments' uploads (a complex128 factor of 8192 rows)


class _Link:
    """One GPU's buffers: page-locked host memory and GPU memory each way, a stream each way."""

    def __init__(self, cp, g, up_bytes, down_bytes):
        self.cp, self.g, self.rt = cp, g, cp.cuda.runtime
        self.up_bytes, self.down_bytes = up_bytes, down_bytes
        self.host_up = cp.cuda.alloc_pinned_memory(up_bytes)
        self.host_down = cp.cuda.alloc_pinned_memory(max(down_bytes, 1))
        with cp.cuda.Device(g):
            self.dev_up = cp.cuda.alloc(up_bytes)
            self.dev_down = cp.cuda.alloc(max(down_bytes, 1))
            self.s_up, self.s_down = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)

    def up(self):
        with self.cp.cuda.Device(self.g):
            self.rt.memcpyAsync(self.dev_up.ptr, self.host_up.ptr, self.up_bytes, self.rt.memcpyHostToDevice,
                                self.s_up.ptr)

    def segmented_bytes(self, segment):
        """The bytes up_2d moves: whole columns of PITCH bytes, as many as the upload's bytes hold, in stretches of
        ``segment`` bytes."""
        return self.up_bytes // PITCH * (PITCH // segment * segment)

    def up_2d(self, segment):
        """The upload's buffer, seen as columns PITCH bytes apart, by 2D copies of ``segment`` bytes of every
        column, one copy per stretch of rows."""
        cols = self.up_bytes // PITCH
        with self.cp.cuda.Device(self.g):
            for r0 in range(0, PITCH // segment * segment, segment):
                self.rt.memcpy2DAsync(self.dev_up.ptr + r0, PITCH, self.host_up.ptr + r0, PITCH, segment, cols,
                                      self.rt.memcpyHostToDevice, self.s_up.ptr)

    def down(self):
        with self.cp.cuda.Device(self.g):
            self.rt.memcpyAsync(self.host_down.ptr, self.dev_down.ptr, self.down_bytes, self.rt.memcpyDeviceToHost,
                                self.s_down.ptr)

    def peer(self, other):
        """down_bytes from ``other``'s GPU memory into this GPU's, on this GPU's write-back stream."""
        with self.cp.cuda.Device(self.g):
            self.rt.memcpyPeerAsync(self.dev_down.ptr, self.g, other.dev_down.ptr, other.g, self.down_bytes,
                                    self.s_down.ptr)

    def sync(self):
        with self.cp.cuda.Device(self.g):
            self.s_up.synchronize()
            self.s_down.synchronize()
