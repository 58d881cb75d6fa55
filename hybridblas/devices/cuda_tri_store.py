"""One triangle of a square GPU block stored straight into page-locked host memory: the triangle's diagonal
blocks (PANEL wide) by a kernel, whose threads write each column's part inside them (the diagonal included)
over PCIe, and the rest of each panel of columns by DMA; nothing else of the host array is touched, and no host
step follows.

The band call stores its diagonal blocks so: the kernel's part (queue_diagonals) on its compute stream right after
the product that made the block, the DMA's part (queue_off_diagonal) on its write-back stream. A DMA copy cannot
stop at the diagonal: downloads.queue_triangle sends each 128-column panel's part below its diagonal block by DMA
and the diagonal blocks through a page-locked buffer, then copies their triangles on the host once they have
landed, a step that held the last block's write-back of a call back by 1-2 ms on 2 x H100 (zgemmt n = 8192, where
the host threads that queue the call's work take turns for the interpreter).

Host memory is reachable from the GPU where the device can use the host pointer of registered memory
(cudaDevAttrCanUseHostPointerForRegisteredMem) and CUDA gives a device address for it (cudaHostGetDevicePointer):
``address`` returns it, or None where either fails (then the caller copies by DMA). The kernel works in
8-byte words (a complex128 entry is two), so the host array needs 8-byte alignment only.
"""
import ctypes
import threading

from .. import downloads, host_pinning
from ..problem import leading_dim

ENABLED = True            # module switch (benchmarks.blas band-settings compares the DMA panels on the same inputs)
THREADS = 128             # threads per column of the triangle
PANEL = 128               # queue(): the parts of the triangle outside its PANEL-wide diagonal blocks go by DMA, the
                          # kernel stores those blocks' triangles only (0: the whole triangle by the kernel, whose
                          # threads then share the SMs with the band call's products for the whole write-back). 2 x
                          # H100, settings in turns (benchmarks.blas band-settings --turns), n = k: the whole triangle
                          # by the kernel took 1.025 / 1.028 x as long for zherk at 8192 / 16384, 1.016 / 1.002 for
                          # zher2k, 1.00-1.01 for zgemmt
CAN_USE_HOST_POINTER = 91  # cudaDevAttrCanUseHostPointerForRegisteredMem

_SOURCE = r"""
extern "C" __global__ void tri_store(unsigned long long src_addr, long long lds,
                                     unsigned long long dst_addr, long long ldd,
                                     int n, int words, int lower, int panel)
{
    // column j of an n x n block whose entries are `words` doubles each, within its panel's diagonal block
    // (panels of `panel` columns): rows [j, end of the panel) (lower) or [start of the panel, j] (upper)
    int j = blockIdx.x;
    long long p0 = (long long) (j / panel) * panel;
    long long p1 = p0 + panel < n ? p0 + panel : n;
    long long r0 = lower ? (long long) j * words : p0 * words;
    long long r1 = lower ? p1 * words : (long long) (j + 1) * words;
    const double* s = (const double*) src_addr + (long long) j * lds;
    double* d = (double*) dst_addr + (long long) j * ldd;
    for (long long r = r0 + threadIdx.x; r < r1; r += blockDim.x)
        d[r] = s[r];
}
"""
_kernels = {}
_usable = {}
_lock = threading.Lock()


def _kernel(cupy):
    key = cupy.cuda.Device().id
    with _lock:
        if key not in _kernels:
            _kernels[key] = cupy.RawKernel(_SOURCE, "tri_store")
        return _kernels[key]


def prepare(cupy, devices):
    """Compile (or load from CuPy's kernel cache) the kernel on ``devices`` (indices) in the background; the
    background work, or None when every device has it."""
    from . import cuda_compile
    with _lock:
        todo = [d for d in dict.fromkeys(int(d) for d in devices) if d not in _kernels]
    return cuda_compile.in_background(cupy, todo, lambda: _kernel(cupy))


def _device_ok(cupy):
    key = cupy.cuda.Device().id
    with _lock:
        if key not in _usable:
            try:
                _usable[key] = cupy.cuda.runtime.deviceGetAttribute(CAN_USE_HOST_POINTER, key) == 1
            except Exception:            # noqa: BLE001 - an attribute this runtime lacks: DMA copies
                _usable[key] = False
        return _usable[key]


def address(cupy, dst):
    """The device address of host array ``dst``'s first entry on the current GPU (page-locked memory the GPU can
    reach), or None."""
    lib = host_pinning.cudart() if ENABLED else None
    if lib is None or not _device_ok(cupy) or dst.ctypes.data % 8:
        return None
    out = ctypes.c_void_p()
    if lib.cudaHostGetDevicePointer(ctypes.byref(out), ctypes.c_void_p(dst.ctypes.data), 0) != 0:
        lib.cudaGetLastError()           # not registered memory: clear the error, the caller copies by DMA
        return None
    return out.value


def panel_width(n, panel=None):
    """Columns per panel for an n x n triangle: ``panel`` (default PANEL), or n where it is 0 or at least n (the
    whole triangle by the kernel)."""
    panel = PANEL if panel is None else panel
    return n if not panel or panel >= n else int(panel)


def queue(cupy, dst, dst_address, src, lower, stream, panel=None):
    """dst[tri] <- src[tri] on ``stream`` (the lower triangle with ``lower``, else the upper; the diagonal
    included): ``src`` a column-major square cupy view of float64 or complex128, ``dst`` a column-major host view
    of the same shape and dtype whose first entry has device address ``dst_address`` (``address``). ``panel``
    (default PANEL): in panels of that many columns, each panel's part below (above) its diagonal block one 2D
    DMA, the diagonal blocks' triangles by the kernel; 0, or n and more: the whole triangle by the kernel."""
    queue_diagonals(cupy, dst, dst_address, src, lower, stream, panel)
    queue_off_diagonal(dst, src, lower, stream, panel)


def queue_diagonals(cupy, dst, dst_address, src, lower, stream, panel=None):
    """The kernel's part of ``queue``: the triangles of the panels' diagonal blocks (the whole triangle where
    panel_width is n). It runs on the SMs: the band call queues it on its compute stream right after the product
    that made the block, where it takes its turn between products; on the write-back's stream it waited for SMs
    until the product after it ended (2 x H100, zgemmt n = k = 16384: blocks with a diagonal block went back at
    7-11 GB/s, those without at 28-46)."""
    import numpy as np
    n = src.shape[0]
    if n == 0:
        return
    panel = panel_width(n, panel)
    words = src.dtype.itemsize // 8
    lds, ldd = leading_dim(src), leading_dim(dst)
    _kernel(cupy)((n,), (THREADS,),
                  (np.uint64(src.data.ptr), np.int64(lds * words), np.uint64(dst_address), np.int64(ldd * words),
                   np.int32(n), np.int32(words), np.int32(bool(lower)), np.int32(panel)),
                  stream=stream)


def queue_off_diagonal(dst, src, lower, stream, panel=None):
    """The DMA part of ``queue``: each panel's part below (above) its diagonal block, one 2D copy each (nothing
    where panel_width is n)."""
    n = src.shape[0]
    panel = panel_width(n, panel)
    if 0 < n and panel < n:
        downloads.queue_off_diagonal(dst, src, lower, stream, panel)
