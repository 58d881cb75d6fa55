"""Kernels compiled ahead of their first call, on a background worker (hybridblas.lowlevel.prepare_kernels)."""
import time

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


class Jobs:
    """Compilations running side by side (Jobs of ``in_background``), waited for as one: ``join``/``wait``
    returns True once every one has finished (``timeout``: seconds for all of them together)."""
    __slots__ = ("jobs",)

    def __init__(self, jobs):
        self.jobs = tuple(jobs)

    def wait(self, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        return all([job.wait(None if end is None else max(0.0, end - time.monotonic())) for job in self.jobs])

    join = wait

    def done(self):
        return all(job.done() for job in self.jobs)

    def is_alive(self):
        return not self.done()


def together(*jobs):
    """The Jobs given (None for nothing to do) as one: None when there are none, the Job itself when there is
    one, else Jobs."""
    jobs = [job for job in jobs if job is not None]
    return None if not jobs else jobs[0] if len(jobs) == 1 else Jobs(jobs)
