"""The end of a band call (devices.cuda_bands) in balance: a GPU that runs late hands the last part of k of one of
its last blocks to the GPU that will be free first, which computes that part into a buffer of its own after its
own blocks; the part is then copied back over NVLink and added to the block beside the late GPU's next blocks, and
the block written back.

The bands follow the speeds earlier calls measured, but kernel rates move by 4-8 % from call to call: on 2 x H100,
zgemmt n = k = 16384, one GPU ended 7-8 ms (4 % of the call) after the other, GPU 0 in one call, GPU 1 in the next.
With the parts the two ended within 0.3-4 ms of each other; in turns against calls without them (benchmarks.blas
band-settings, 2 x H100, zgemmt) the rounds' best calls took 0.995 x as long at 16384 (two processes), 1.001 x at
8192: the calls' own spread (180-209 ms at 16384, the GPUs' clocks moving together) is larger. Moving 0.7 of the
estimated imbalance instead of all of it: 1.014 x as long.

- Each GPU's worker keeps at most two blocks queued ahead over the last TRACK of its band's flops: before it
  queues block b it waits for block b - 2 to end, and so knows where its GPU stands (``Pace``: seconds the blocks
  took over what the speeds gave them, from the first such wait on) and when its work will end (``Balance.report``).
- At each of its last GIVE_BLOCKS blocks, a GPU whose work would end after another's (one that has reported and
  has handed out nothing) hands that one the last share of the block's k that brings both to end together
  (``Balance.split``): at most MAX_SHARE, and only where it moves at least MIN_MOVE seconds more than the split
  adds at the end (the part's copy back; for a block before the last, its write-back, which then comes after the
  last block instead of under its compute: on 2 x H100, zgemmt n = k = 16384, a part of 7 % of a 30 ms block
  left 4.5 ms of that block's write-back after the call's last product). A GPU gives or
  takes, never both, in a call: a giver's last step waits for its takers' parts, a taker serves its parts
  once every GPU has stopped giving (``Balance.close``), so none waits for another that waits for it.

Pure arithmetic and locks: tested without a GPU.
"""
import queue
import threading

TRACK = 0.5               # the share of a band's flops, at its end, over which its worker keeps two blocks queued ahead
GIVE_BLOCKS = 2           # a GPU's last this many blocks may hand part of their k to another GPU
MAX_SHARE = 0.85          # at most this share of a block's k goes to another GPU
MIN_MOVE = 3e-4           # s: a part worth less of the giver's time stays with it (the taker copies the block's
                          # factor rows over NVLink, the giver adds the part: 0.1-0.3 ms)
PART_COST = 1.1           # a part runs this many times as long on its taker as the same flops of its own blocks
PACE_LIMITS = (0.25, 4.0) # the most a call's pace may stray from the speeds


class Pace:
    """Where one GPU stands in its band: ``observe(now, done)`` each time the worker saw a block end (``done``: the
    modelled seconds of the blocks ended so far); ``factor()``: the seconds the blocks took over their modelled
    seconds since the first observation (1.0 before two), within PACE_LIMITS."""

    def __init__(self):
        self.first = None
        self.last = None

    def observe(self, now, done):
        if self.first is None:
            self.first = (now, done)
        self.last = (now, done)

    def factor(self):
        if self.first is None or self.last[1] <= self.first[1]:
            return 1.0
        ratio = (self.last[0] - self.first[0]) / (self.last[1] - self.first[1])
        return min(max(ratio, PACE_LIMITS[0]), PACE_LIMITS[1])


class Lane:
    """One GPU's last blocks, as its worker goes through them: ``seconds`` each block's modelled time, ``first`` the
    first block of the last TRACK of them (the worker waits for block b - 2 to end before it queues b), ``give_from``
    the first that may hand part of its k to another GPU (the last GIVE_BLOCKS), ``kept`` the share of each block's
    k the GPU computes itself."""

    def __init__(self, slot, seconds):
        self.slot, self.seconds = slot, list(seconds)
        self.kept = [1.0] * len(self.seconds)
        self.pace = Pace()
        first, acc = len(self.seconds), 0.0
        while first > 0 and acc < TRACK * sum(self.seconds):
            first -= 1
            acc += self.seconds[first]
        self.first = first
        self.give_from = max(first, len(self.seconds) - GIVE_BLOCKS)

    def step(self, balance, b, now, cost, k0, k1, align, after=0.0):
        """Block b - 2 ended at ``now`` (block b - 1 runs): report when this GPU's work ends and, at a block that may
        give, ask ``balance`` to split block b over k range [k0, k1) (Balance.split; ``cost(t)``: the whole block's
        seconds on GPU t; ``after``: seconds a split adds after this GPU's end): (taker, cut) or None."""
        self.pace.observe(now, sum(self.seconds[:max(b - 1, 0)]))
        pace = self.pace.factor()
        left = pace * sum(s * kept for s, kept in zip(self.seconds[max(b - 1, 0):], self.kept[max(b - 1, 0):]))
        if b < self.give_from:
            balance.report(self.slot, now, left)
            return None
        decision = balance.split(self.slot, now, left, pace * self.seconds[b], cost, k0, k1, align, after)
        if decision is not None:
            self.kept[b] = (decision[1] - k0) / (k1 - k0)
        return decision


class Balance:
    """The GPUs of one call handing parts of their last blocks to each other: when each one's work is expected to end
    (host clock, ``time.perf_counter``), who gave and who took, each GPU's inbox of parts (filled by ``split``'s
    caller, and None once every GPU has stopped giving), and whether every GPU has stopped giving (``closed``)."""

    def __init__(self, slots):
        self.lock = threading.Lock()
        self.ends = [None] * slots          # None: not reported yet (not a taker)
        self.giver = [False] * slots
        self.taker = [False] * slots
        self.received = [0.0] * slots       # seconds of parts handed to each GPU
        self.inbox = [queue.SimpleQueue() for _ in range(slots)]
        self._open = slots
        self.closed = threading.Event()
        if slots == 0:
            self.closed.set()

    def report(self, g, now, left):
        """GPU g's own work ends ``left`` seconds after ``now`` (the parts it received come after it)."""
        with self.lock:
            self.ends[g] = now + left + self.received[g]

    def split(self, g, now, left, block, cost, k0, k1, align, after=0.0):
        """GPU g, ``left`` seconds of its own work to go from ``now``, is at a block over k range [k0, k1) that takes
        ``block`` of them: (taker, cut) where the block's k from ``cut`` on (a multiple of ``align`` long) goes to
        GPU ``taker``, or None. ``cost(t)``: seconds the whole block would take on GPU t; ``after``: seconds the
        split adds after g's end (the part's copy back, and a block before g's last one written back only then,
        not under the last one's compute): a split moves at least that plus MIN_MOVE. The taker is the GPU
        expected to be free first that has reported and given nothing."""
        with self.lock:
            self.ends[g] = now + left + self.received[g]
            if self.taker[g] or block <= 0:
                return None
            free = [(max(end - now, 0.0), t) for t, end in enumerate(self.ends)
                    if t != g and end is not None and not self.giver[t]]
            if not free:
                return None
            t_left, t = min(free)
            c = cost(t) * PART_COST
            share = min(MAX_SHARE, (left - t_left) / (block + c))
            cut = split_k(k0, k1, share, align) if share * block >= MIN_MOVE + after else None
            if cut is None:
                return None
            share = (k1 - cut) / (k1 - k0)
            self.ends[g] -= share * block
            self.ends[t] = max(self.ends[t], now) + share * c
            self.received[t] += share * c
            self.giver[g] = self.taker[t] = True
            return t, cut

    def close(self, g):
        """GPU g hands out nothing more (its worker is past its last block, or stopped). Once every GPU has closed,
        each inbox ends with None: a taker's wait returns at once."""
        with self.lock:
            self._open -= 1
            if self._open == 0:
                self.closed.set()
                for box in self.inbox:
                    box.put(None)


def split_k(k0, k1, share, align):
    """The k where a block's range [k0, k1) is cut so that about ``share`` of it, a multiple of ``align``, goes to
    the taker ([cut, k1)); None where that leaves either side empty."""
    give = int(round(share * (k1 - k0) / align)) * align
    cut = k1 - give
    return cut if k0 < cut < k1 else None


def pieces_over(pieces, reads, k0, k1):
    """The pieces (band_plan.Piece) that hold any of ``reads`` (band_outer.task_reads) over k range [k0, k1), in
    order."""
    return [x for x in pieces if x.k0 < k1 and k0 < x.k1
            and any(u == x.factor and x.o0 < hi and lo < x.o1 for u, lo, hi in reads)]
