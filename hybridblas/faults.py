"""What a call raises or warns when a device fails, and the internal signal that stops a call's tiles."""

__all__ = ["DeviceFailure", "DeviceFailureWarning"]


class DeviceFailureWarning(RuntimeWarning):
    """A device raised during a call; its unfinished tiles were re-run on the other devices."""


class DeviceFailure(RuntimeError):
    """A call could not be completed because its devices failed.

    C is partly updated: every tile of C that a device finished holds its new value, the others their old
    one, except the ``torn`` tiles (plan.Task objects: rows i0:i1, columns j0:j1 of the column-major C),
    which were being written when the fault struck. ``errors`` lists (device name, exception); the first
    exception is also the ``__cause__``.
    """

    def __init__(self, errors, torn=(), message_tail=None):
        self.errors = list(errors)
        self.torn = list(torn)
        names = "; ".join(f"{name}: {type(exc).__name__}: {exc}" for name, exc in self.errors)
        tail = message_tail or "no device of the call is left"
        super().__init__(f"{tail} ({names}). C is partly updated: finished tiles hold the new values, "
                         f"the others their old ones" + (f", except {len(self.torn)} torn tile(s)" if self.torn else ""))
        if self.errors:
            self.__cause__ = self.errors[0][1]


class Cancelled(Exception):
    """Raised inside a device run when its call is being stopped (an interrupt): not a device failure."""
