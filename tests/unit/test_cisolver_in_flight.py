"""cisolver.arrays' list of queued copies not known to have landed (their buffers held until the copy's event has
passed): an entry that another thread adds while one prunes the list is kept; landed entries are dropped."""
import threading

from cisolver import arrays


class _Pending:
    done = False          # never passes: its entry must stay


class _Landed:
    done = True


class _Window(list):
    """A list whose first pruning lets another thread add its entry in the middle (waiting up to 0.3 s for it):
    between the pruned list being made and being stored."""

    def __init__(self):
        super().__init__()
        self.other = None

    def __setitem__(self, key, value):
        if self.other is None:
            self.other = threading.Thread(target=arrays._keep_until_landed, args=(_Pending(), "other"))
            self.other.start()
            self.other.join(0.3)
        super().__setitem__(key, value)


def test_an_entry_added_while_another_thread_prunes_is_kept(monkeypatch):
    window = _Window()
    monkeypatch.setattr(arrays, "_in_flight", window)
    arrays._keep_until_landed(_Pending(), "mine")
    window.other.join()
    assert sorted(entry[1] for entry in window) == ["mine", "other"]


def test_landed_entries_are_dropped(monkeypatch):
    monkeypatch.setattr(arrays, "_in_flight", [])
    arrays._keep_until_landed(_Landed(), "landed")
    arrays._keep_until_landed(_Pending(), "pending")
    assert [entry[1] for entry in arrays._in_flight] == ["pending"]
