"""k-points over MPI ranks (mpi4py): radial functions and T are computed once on rank 0 and broadcast,
each rank builds H and S for its own k-points on its own GPUs (local rank -> device), and the reports
are gathered on rank 0. Without MPI (comm None) everything runs in this process.

The checks before a build run on every rank and fail on all of them when they fail on one
(``on_every_rank``), so no rank is left waiting for one that stopped."""
import hybridblas as hb
from hybridblas import distributed
from hybridblas.console import CLIError

__all__ = ["world", "share_k_independent", "my_kpoints", "gather_reports", "rank_context", "check_devices",
           "on_every_rank", "ranks_on_node"]

world = distributed.world


def ranks_on_node(comm):
    """How many ranks share this node's memory (1 without MPI)."""
    return distributed.local_rank(comm)[1]


def on_every_rank(comm, check):
    """``check()`` on every rank; when it raises on any rank, every rank raises (that rank's error, or a
    CLIError naming the first rank that failed and its message). Returns check()'s value."""
    if comm is None:
        return check()
    try:
        result, error = check(), None
    except Exception as exc:           # any failure: the other ranks must hear of it, not wait
        result, error = None, exc
    failures = comm.allgather(None if error is None else str(error))
    if error is not None:
        raise error
    for r, message in enumerate(failures):
        if message is not None:
            raise CLIError(f"rank {r}: {message}")
    return result


def check_devices(devices, comm):
    """The DeviceSpec that --devices names, checked before any work (hybridblas.parse_devices); under MPI
    only every-device words (all, gpu, cpu), since each rank takes its share of the node's GPUs."""
    spec = hb.parse_devices(devices, name="--devices")
    if comm is not None and hb.devspec.device_words(devices, name="--devices")[3]:
        raise ValueError(f"under MPI --devices must be all, gpu or cpu (one GPU per local rank), got {devices!r}")
    return spec


def share_k_independent(cell, comm):
    """Compute the k-independent data (classes, radial functions, T) on rank 0 and broadcast it."""
    if comm is None:
        return cell
    shared = cell._shared
    if comm.Get_rank() == 0:
        cell.tmats           # fills classes, radial functions and T matrices
    cell._shared = comm.bcast(shared if comm.Get_rank() == 0 else None, root=0)
    return cell


def my_kpoints(kpoints, comm):
    """(index, k) pairs this rank builds: round-robin, so every rank gets a near-equal count."""
    if comm is None:
        return list(enumerate(kpoints))
    size, rank = comm.Get_size(), comm.Get_rank()
    return [(ik, k) for ik, k in enumerate(kpoints) if ik % size == rank]


def gather_reports(reports, comm):
    """Every rank's per-k reports on rank 0, in k-point order (None on the other ranks)."""
    if comm is None:
        return reports
    everything = comm.gather(reports, root=0)
    if comm.Get_rank() != 0:
        return None
    return sorted((r for part in everything for r in part), key=lambda r: r["k_index"])


def rank_context(comm, spec, strategy, emulation=None):
    """This rank's hybridblas Context for the devices of ``spec`` (a DeviceSpec from check_devices): all of
    them without MPI; under MPI its share of the node's GPUs and cores. ``emulation``: the Context's (None:
    FP64 units; "int8": large float64/complex128 tiles on the GPUs' INT8 tensor cores)."""
    if comm is None:
        return hb.Context(devices=spec.names, strategy=strategy, emulation=emulation)
    word = ("all" if spec.cpu else "gpu") if spec.gpus else "cpu"
    return distributed.node_context(comm, word, strategy=strategy, emulation=emulation)
