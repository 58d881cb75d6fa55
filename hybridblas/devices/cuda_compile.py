"""Kernels compiled ahead of their first call, on a background worker (hybridblas.lowlevel.prepare_kernels)."""
from .. import workers


def in_background(cupy, devices, compile_one):
    """compile_one() on each GPU of ``devices`` (indices), one after the other on a background worker; its Job, or
    None when ``devices`` is empty. A failure is left to the first call that needs the kernels: it compiles
    again and raises."""
    if not devices:
        return None

    def work():
        for device in devices:
            try:
                with cupy.cuda.Device(device):
                    compile_one()
            except Exception:
                pass
    return workers.start(work, name="cuda-compile")
