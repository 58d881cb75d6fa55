"""Panels of the factors kept on one GPU for one call, and the call-wide index of who holds which panel.

A panel is the part of a factor's column-major base that a row (or column) range of C needs over one
k range. Tiles that share a row or column reuse it; under memory pressure the least recently used panel
goes first. When another GPU already holds a panel of a host operand, this GPU copies it from there over
NVLink instead of moving it across PCIe a second time.
"""
import collections
import threading


class Panel:
    __slots__ = ("key", "array", "owned", "ready", "last_use", "nbytes")

    def __init__(self, key, array, owned, ready):
        self.key = key            # (factor, outer0, outer1, k0, k1)
        self.array = array        # base-oriented block (cupy), its own memory when ``owned``
        self.owned = owned
        self.ready = ready        # cupy Event after which the data is there (None: already there)
        self.last_use = None      # cupy Event after the last kernel that read it
        self.nbytes = array.nbytes if owned else 0


class PanelCache:
    """LRU panels of one GPU with a byte capacity; eviction is stream-ordered, never a host stall."""

    def __init__(self, capacity, free_stream, share=None, device=None):
        self.capacity = capacity
        self.free_stream = free_stream     # allocations and frees of panel memory happen on this stream
        self.panels = collections.OrderedDict()
        self.bytes = 0
        self.share = share
        self.device = device

    def find(self, f, o0, o1, k0, k1):
        for key, p in reversed(self.panels.items()):
            if key[0] == f and key[1] <= o0 and o1 <= key[2] and key[3] <= k0 and k1 <= key[4]:
                self.panels.move_to_end(key)
                return p
        return None

    def add(self, panel):
        self.panels[panel.key] = panel
        self.bytes += panel.nbytes

    def make_room(self, nbytes, keep=()):
        """Evict least recently used panels (not in ``keep``) until ``nbytes`` more fit. False if impossible."""
        for key in list(self.panels):
            if self.bytes + nbytes <= self.capacity:
                break
            if key in keep:
                continue
            self.evict(key)
        return self.bytes + nbytes <= self.capacity

    def evict(self, key):
        p = self.panels.pop(key)
        self.bytes -= p.nbytes
        if self.share is not None and p.owned:
            for ev in self.share.withdraw(self.device, key):
                self.free_stream.wait_event(ev)      # a peer still copying from it
        if p.last_use is not None:
            self.free_stream.wait_event(p.last_use)  # the pool reuses it only on free_stream: ordered
        p.array = None

    def clear(self):
        for key in list(self.panels):
            self.evict(key)


class CallShare:
    """Which GPU holds which panel of a host operand during one call (shared by that call's GPUs)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.entries = {}      # key -> {"device", "panel", "readers": [events], "landed": threading.Event}
        self.users = 0

    def claim(self, device, key):
        """Returns (entry, mine): an entry another GPU holds or is filling, or a new one this GPU fills."""
        with self.lock:
            e = self.entries.get(key)
            if e is not None and e["device"] != device:
                return e, False
            e = {"device": device, "panel": None, "readers": [], "landed": threading.Event()}
            self.entries[key] = e
            return e, True

    def publish(self, entry, panel):
        entry["panel"] = panel
        entry["landed"].set()

    def abandon(self, device, key):
        with self.lock:
            e = self.entries.get(key)
            if e is not None and e["device"] == device:
                del self.entries[key]
                e["landed"].set()

    def read(self, entry, copy):
        """Run ``copy(panel)`` (which queues a peer copy and returns its event) while the owner can't evict."""
        with self.lock:
            panel = entry["panel"]
            if panel is None or panel.array is None or self.entries.get(panel.key) is not entry:
                return None
            ev = copy(panel)
            entry["readers"].append(ev)
            return ev

    def withdraw(self, device, key):
        with self.lock:
            e = self.entries.get(key)
            if e is None or e["device"] != device:
                return []
            del self.entries[key]
            return list(e["readers"])


_shares = {}
_shares_lock = threading.Lock()


def join_share(call_id):
    with _shares_lock:
        s = _shares.get(call_id)
        if s is None:
            s = _shares[call_id] = CallShare()
        s.users += 1
        return s


def leave_share(call_id, device):
    """Withdraw this GPU's entries; return the reader events its memory must wait for before reuse."""
    with _shares_lock:
        s = _shares.get(call_id)
        if s is None:
            return []
        with s.lock:
            events = []
            for key in [k for k, e in s.entries.items() if e["device"] == device]:
                e = s.entries.pop(key)
                e["landed"].set()
                events += e["readers"]
        s.users -= 1
        if s.users <= 0:
            del _shares[call_id]
        return events
