"""Progress on stderr: tqdm when it is installed, else one plain line per step."""
import sys
import time


class Progress:
    def __init__(self, total, enabled=True, stream=None):
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, file=self.stream, unit="step", dynamic_ncols=True)
            except ImportError:
                self._bar = None

    def step(self, message):
        """One step finished; ``message`` says what it measured."""
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(message[:60], refresh=False)
            self._bar.update(1)
        else:
            width = len(str(self.total))
            elapsed = time.perf_counter() - self.t0
            print(f"[{self.done:>{width}}/{self.total} {elapsed:6.1f}s] {message}", file=self.stream, flush=True)

    def note(self, message):
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def close(self):
        if self._bar is not None:
            self._bar.close()
