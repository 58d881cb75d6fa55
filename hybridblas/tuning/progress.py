"""Calibration progress: a bar on stderr only when it is a terminal, each step's result in the debug log."""
import logging

from ..console import progress as _bar

log = logging.getLogger(__name__)


class Progress:
    """``step(message)`` after each measurement: the bar (hybridblas.console.progress) advances and shows
    the message; the message also goes to the 'hybridblas' logger at DEBUG level (-v in the CLI)."""

    def __init__(self, total, enabled=True):
        self._bar = _bar(total, "calibrate", enabled)

    def step(self, message):
        log.debug(message)
        show = getattr(self._bar, "set_postfix_str", None)     # tqdm's; the silent stand-in has none
        if show is not None:
            show(message[:60], refresh=False)
        self._bar.update(1)

    def close(self):
        self._bar.close()
