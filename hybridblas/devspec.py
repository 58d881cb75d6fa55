"""One device syntax for every entry point (``hb.Context``, ``flapw build``, ``cisolver spectrum``).

    cpu                 the host's cores
    gpu (or cuda)       every visible CUDA GPU
    all                 the host's cores and every visible GPU (just the cores where there is none)
    0,1                 GPUs 0 and 1
    cuda:0,cuda:1       the same
    cpu,cuda:1          the cores and GPU 1

A list of such words works too. ``parse_devices`` checks everything before any work starts: a GPU asked
for without CuPy installed, an index past the visible GPUs, a word it does not know, a device named twice
— each is a ValueError that names the value and what to do.
"""
from dataclasses import dataclass
from numbers import Integral

__all__ = ["DeviceSpec", "parse_devices", "device_words", "check_gpu_ids", "gpu_count", "gpu_multiprocessors",
           "CUDA_INSTALL_HINT"]

CUDA_INSTALL_HINT = 'install the GPU extra: pip install "hybridblas[cuda13]" (or "hybridblas[cuda12]")'


def _cupy_state():
    """(cupy module or None, visible GPU count, why there are none)."""
    try:
        import cupy
    except ImportError:
        return None, 0, f"CuPy is not installed; {CUDA_INSTALL_HINT}"
    try:
        count = cupy.cuda.runtime.getDeviceCount() if cupy.is_available() else 0
    except Exception as exc:   # a driver or runtime that cannot start
        return cupy, 0, f"CUDA is not usable here ({type(exc).__name__}: {exc})"
    return cupy, count, "no CUDA GPU is visible" if count == 0 else ""


def gpu_count():
    """CUDA GPUs CuPy can see; 0 without CuPy or a driver. Creates no CUDA context."""
    return _cupy_state()[1]


_sm_counts = {}            # GPU id -> multiprocessors


def gpu_multiprocessors(device=None):
    """Streaming multiprocessors of CUDA GPU ``device`` (an id; None: CuPy's current device), for sizing a
    kernel's grid. Asked of the runtime once per GPU (``Device.attributes`` would query every attribute),
    then a dictionary look-up. ValueError for an id that is no visible GPU; TypeError for a non-integer."""
    if device is not None:
        if isinstance(device, bool) or not isinstance(device, Integral):
            raise TypeError(f"device must be a GPU id (int) or None, got {type(device).__name__} {device!r}")
        device = int(device)
    else:
        try:
            import cupy
        except ImportError:
            raise ModuleNotFoundError(f"gpu_multiprocessors needs CuPy; {CUDA_INSTALL_HINT}") from None
        device = cupy.cuda.Device().id
    count = _sm_counts.get(device)
    if count is not None:
        return count
    cupy, visible, why = _cupy_state()
    if not 0 <= device < visible:
        raise ValueError(f"device must be a visible GPU id, got {device}: "
                         + (f"{visible} GPU(s) are visible (ids 0..{visible - 1})" if visible else why))
    count = _sm_counts[device] = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    return count


@dataclass(frozen=True)
class DeviceSpec:
    """A validated device choice: the host's cores or not, and GPU ids in the order given."""
    cpu: bool
    gpus: tuple

    @property
    def names(self):
        """Device names as hybridblas.Context takes them: ['cpu', 'cuda:0', ...]."""
        return (["cpu"] if self.cpu else []) + [f"cuda:{i}" for i in self.gpus]

    @property
    def gpu_only(self):
        return not self.cpu

    def __str__(self):
        return ",".join(self.names)


def _words(spec, name):
    if isinstance(spec, str):
        words = [w.strip() for w in spec.split(",")]
    elif isinstance(spec, (list, tuple)):
        words = list(spec)
    else:
        raise TypeError(f"{name} must be a string like 'cpu', 'gpu', 'all', '0,1' or 'cuda:0', or a list of "
                        f"them, got {type(spec).__name__} {spec!r}")
    if not words or any(w == "" for w in words):
        raise ValueError(f"{name} must name at least one device ('cpu', 'gpu', 'all', '0,1', 'cuda:0'), "
                         f"got {spec!r}")
    return words


def _gpu_index(word):
    """The GPU id a word names ('3', 3, 'cuda:3'), or None when it is not a single-GPU word."""
    if isinstance(word, bool):
        return None
    if isinstance(word, int):
        return word
    if not isinstance(word, str):
        return None
    text = word.strip().lower()
    if text.startswith("cuda:"):
        text = text[5:]
    return int(text) if text.isascii() and text.isdigit() else None


def device_words(spec, *, name="devices"):
    """The syntax alone, nothing queried: (cpu, every_gpu, gpus_optional, gpu ids in order).

    ``gpus_optional`` is True for a lone 'all' (the cores suffice where there is no GPU).
    """
    words = _words(spec, name)
    cpu, every_gpu, ids = False, False, []
    for w in words:
        key = w.strip().lower() if isinstance(w, str) else w
        if key == "cpu":
            if cpu:
                raise ValueError(f"{name}: 'cpu' is named twice in {spec!r}")
            cpu = True
        elif key in ("gpu", "cuda"):
            every_gpu = True
        elif key == "all":
            cpu, every_gpu = True, True
        else:
            idx = _gpu_index(w)
            if idx is None:
                raise ValueError(f"{name}: unknown device {w!r} in {spec!r}; use cpu, gpu, all, GPU ids like "
                                 f"0,1 or cuda:0,cuda:1")
            if idx in ids:
                raise ValueError(f"{name}: GPU {idx} is named twice in {spec!r}")
            ids.append(idx)
    if every_gpu and ids:
        raise ValueError(f"{name}={_show(spec)} names every GPU and single GPUs at once")
    optional = len(words) == 1 and isinstance(words[0], str) and words[0].strip().lower() == "all"
    return cpu, every_gpu, optional, tuple(ids)


def check_gpu_ids(ids, spec, name="devices"):
    """Raise ValueError unless every id in ``ids`` is a visible GPU (CuPy installed, driver working)."""
    _cupy, count, why = _cupy_state()
    if count == 0:
        raise ValueError(f"{name}={_show(spec)} asks for CUDA GPUs, but {why}")
    for i in ids:
        if not 0 <= i < count:
            raise ValueError(f"{name}={_show(spec)}: GPU {i} does not exist; {count} GPU(s) are visible "
                             f"(ids 0..{count - 1})")
    return count


def parse_devices(spec, *, name="devices"):
    """Validate ``spec`` (see the module docstring) and return a ``DeviceSpec``.

    ``name`` is how the caller's users know the argument ("devices", "--devices"): every message names
    it and the value. GPUs are checked against what CuPy sees, so a wrong choice fails here, before work.
    """
    cpu, every_gpu, optional, ids = device_words(spec, name=name)
    if not every_gpu and not ids:
        return DeviceSpec(cpu=True, gpus=())
    if every_gpu and optional and gpu_count() == 0:
        return DeviceSpec(cpu=True, gpus=())          # 'all' on a node without GPUs: the cores
    count = check_gpu_ids(ids, spec, name)
    return DeviceSpec(cpu=cpu, gpus=tuple(range(count)) if every_gpu else ids)


def _show(spec):
    return repr(spec if isinstance(spec, str) else ",".join(map(str, spec)))
