"""k-points over MPI ranks (mpi4py): radial functions and T are computed once on rank 0 and broadcast,
each rank builds H and S for its own k-points on its own GPUs (local rank -> device), and the reports
are gathered on rank 0. Without MPI (comm None) everything runs in this process."""
from hybridblas import distributed

__all__ = ["world", "share_k_independent", "my_kpoints", "gather_reports", "rank_context"]

world = distributed.world


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


def rank_context(comm, devices, strategy):
    """This rank's hybridblas Context: its share of the node's GPUs and cores."""
    import hybridblas as hb
    if comm is None:
        devs = devices.split(",") if "," in devices else devices
        return hb.Context(devices=devs, strategy=strategy)
    if devices not in ("all", "gpu", "cpu"):
        raise ValueError(f"under MPI --devices must be all, gpu or cpu (one GPU per local rank), got {devices!r}")
    return distributed.node_context(comm, devices, strategy=strategy)
