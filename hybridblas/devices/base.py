"""The device seam: what a scheduler needs from a CPU pool or a GPU.

A scheduler calls ``device.open(problem)`` once per call in the device's worker thread and gets a
``DeviceRun`` holding that call's state (streams, cached panels, partial sums). A run's ``launch`` may
return before the task is finished (a GPU queues it on a stream); ``wait`` blocks until it is done and
its block of C is written where C lives. ``close`` releases the run and returns its split-K partial sum,
if it accumulated one, as an array on C's side (host or the GPU holding C), or None.

After a run raised, ``remainder(task)`` says what is left of a task it was given and did not finish:
(clean, torn) lists of smaller tasks, clean ones not yet written into C, torn ones partly written.
Between tiles a run checks ``problem.run.cancel`` (a threading.Event) and raises
``faults.Cancelled`` when it is set, so an interrupted call stops within a tile's time.
"""
import abc

from ..faults import Cancelled


def check_cancel(problem):
    ev = problem.run.cancel
    if ev is not None and ev.is_set():
        raise Cancelled()


class DeviceRun(abc.ABC):
    @abc.abstractmethod
    def launch(self, task):
        """Start the task; return a handle for ``wait``."""

    @abc.abstractmethod
    def wait(self, handle):
        """Block until the launched task's result is in place."""

    def close(self):
        """Finish the call on this device; return the split-K partial sum or None."""
        return None

    def remainder(self, task):
        """(clean, torn) parts of an unfinished task; by default the whole task, untouched."""
        return [task], []


class Device(abc.ABC):
    kind = None            # "cpu" or "cuda"
    max_in_flight = 1      # tasks a worker may have launched before it waits for the oldest

    @property
    @abc.abstractmethod
    def name(self):
        """A stable label: 'cpu', 'cpu#1', 'cuda:0'."""

    def accepts(self, problem):
        """Whether this device can work on the problem's operands (e.g. a CPU and cupy arrays)."""
        return True

    @abc.abstractmethod
    def open(self, problem):
        """A ``DeviceRun`` for one call."""

    def preferred_block(self, problem):
        """Tile edge this device likes for the dynamic strategy."""
        return 1024

    def release(self):
        """Give back what the device keeps between calls (its Context is being closed). Calls running
        now keep what they hold; a later call makes it again."""

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}>"


_REGISTRY = {}


def register(kind, factory):
    """Register a device kind: ``factory(spec)`` builds the devices for a spec like 'cuda:1' or 'cuda'."""
    _REGISTRY[kind] = factory


def registered(kind):
    return _REGISTRY.get(kind)
