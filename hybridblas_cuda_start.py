"""CUDA's start-up beside a command-line tool's imports: the driver's initialisation (cuInit) and the primary
contexts of the GPUs the command line names, made on a daemon thread through ctypes (which lets the GIL go), while
the main thread imports numpy, scipy, CuPy and the tool.

On a node with two H100s these take 0.23 s (cuInit) and 0.19 s (two contexts) that the run otherwise waits for
after its imports; two MPI ranks starting their contexts at once took 0.22 and 0.35 s. CuPy and NCCL then find
the driver up and use the same primary contexts (the CUDA runtime's), so nothing is made twice.

The GPUs are read from the command line alone (``--devices``, the syntax of hybridblas.devspec), before the tool
checks it; the tool's own check decides. What the guess can cost is a context on a GPU the run does not use
(its memory, until the process ends). So it makes no context on a GPU whose compute mode is not the default
(shared) one, and under an MPI launcher only the one GPU of the rank where the tool takes one GPU per local
rank (``one_per_rank``: local rank r -> the r-th GPU of the list, modulo its length) and the launcher says
the local rank; elsewhere under MPI the driver alone is started. Nothing here raises: a missing driver or a
failing call leaves everything to the tool.
"""
import atexit
import ctypes
import os
import threading

__all__ = ["start", "named_gpus", "under_mpi"]

# set in every rank's environment by the MPI launchers: Open MPI, MPICH/Hydra and Intel MPI (and srun's PMI-1/2),
# PMIx (srun --mpi=pmix, prterun), MVAPICH, Cray ALPS; then each one's local rank (and Slurm's, Cray PALS')
MPI_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS", "PMIX_RANK",
                 "MV2_COMM_WORLD_SIZE", "ALPS_APP_PE")
LOCAL_RANK_VARIABLES = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK",
                        "SLURM_LOCALID", "PALS_LOCAL_RANKID")
COMPUTE_MODE = 20                     # CU_DEVICE_ATTRIBUTE_COMPUTE_MODE; 0: default (shared)

EXIT_WAIT = 10.0                      # seconds a normal exit waits for the thread

_started = None


def under_mpi():
    """Whether an MPI launcher started this process (one of MPI_VARIABLES is set) or HYBRIDBLAS_MPI=1 says so
    (a launcher not in the list). Nothing is imported."""
    return os.environ.get("HYBRIDBLAS_MPI") == "1" or any(v in os.environ for v in MPI_VARIABLES)


def named_gpus(argv):
    """What the last ``--devices`` of ``argv`` names: "every" (gpu, cuda, all), a tuple of GPU ids, or None
    (no option, the cores alone, or a value this reading does not know)."""
    value = None
    for i, word in enumerate(argv):
        if word == "--devices" and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith("--devices="):
            value = word.partition("=")[2]
    if value is None:
        return None
    every, ids = False, []
    for word in (w.strip().lower() for w in value.split(",")):
        if word in ("gpu", "cuda", "all"):
            every = True
        elif word.removeprefix("cuda:").isdigit() and word.isascii():
            ids.append(int(word.removeprefix("cuda:")))
        elif word != "cpu":
            return None
    if every:
        return None if ids else "every"
    return tuple(ids) or None


def start(argv, one_per_rank=False):
    """Start the driver and the named GPUs' contexts on a daemon thread (once per process); the thread, or
    None when ``argv`` names no GPU or it was started before."""
    global _started
    named = named_gpus(argv)
    if named is None or _started is not None:
        return None
    thread = threading.Thread(target=_run, args=(named, one_per_rank), name="cuda-start", daemon=True)
    try:
        thread.start()
    except RuntimeError:                      # no thread to be had: CuPy starts CUDA in its time, as without this
        return None
    _started = thread
    atexit.register(thread.join, EXIT_WAIT)   # a quick exit (--help, bad input) waits for it: never unload the
    return thread                             # driver's library under a call in flight


def _run(named, one_per_rank):
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        if cuda.cuInit(0) != 0:
            return
        count = ctypes.c_int()
        if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return
        for ordinal in _devices(named, count.value, one_per_rank):
            device, mode, context = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
            if (cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
                    and cuda.cuDeviceGetAttribute(ctypes.byref(mode), COMPUTE_MODE, device) == 0
                    and mode.value == 0):
                cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
    except Exception:                       # no driver library, or a call that fails: the tool starts CUDA
        return


def _devices(named, count, one_per_rank):
    """The GPU ordinals to make contexts on: the named ones that exist, or this rank's one."""
    ids = list(range(count)) if named == "every" else [i for i in named if i < count]
    if not under_mpi():
        return ids
    local = next((os.environ[v] for v in LOCAL_RANK_VARIABLES if v in os.environ), "")
    if not (one_per_rank and ids and local.isdigit()):
        return []
    return [ids[int(local) % len(ids)]]
