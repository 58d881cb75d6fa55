"""Where the large products go: hybridblas (default) or a peer with the same call signature.

Every backend exposes herk, her2k, herkx and gemm with hybridblas's (= scipy.linalg.blas's) argument
order.  "cublasxt" looks for ``hybridblas.peers.cublasxt_{herk,her2k,herkx,gemm}`` (the same signature,
no ``context``): the paper's comparison of the same build with every BLAS call sent to cuBLASXt.
"""
import numpy as np

__all__ = ["get_backend", "BackendUnavailable", "BACKENDS"]

BACKENDS = ("hybridblas", "cublasxt")


class BackendUnavailable(RuntimeError):
    pass


class HybridBackend:
    name = "hybridblas"

    def __init__(self, context=None):
        import hybridblas as hb
        self._hb = hb
        self.context = context

    def herk(self, alpha, a, beta, c, trans="C"):
        return self._hb.herk(alpha, a, beta, c, trans=trans, lower=True, context=self.context)

    def her2k(self, alpha, a, b, beta, c, trans="C"):
        return self._hb.her2k(alpha, a, b, beta, c, trans=trans, lower=True, context=self.context)

    def herkx(self, alpha, a, b, beta, c, trans="C"):
        return self._hb.herkx(alpha, a, b, beta, c, trans=trans, lower=True, context=self.context)

    def gemm(self, alpha, a, b, beta, c, transa="N", transb="N"):
        return self._hb.gemm(alpha, a, b, beta, c, transa=transa, transb=transb, context=self.context)


class PeerBackend:
    """Functions named ``{prefix}_{routine}`` in hybridblas.peers, called without ``context``."""

    def __init__(self, prefix, devices=None):
        from hybridblas import peers
        names = ("herk", "her2k", "herkx", "gemm")
        missing = [f"{prefix}_{n}" for n in names if not hasattr(peers, f"{prefix}_{n}")]
        if missing:
            raise BackendUnavailable(f"blas={prefix!r}: hybridblas.peers lacks {', '.join(missing)}")
        self.name = prefix
        self.context = None
        self._f = {n: getattr(peers, f"{prefix}_{n}") for n in names}
        self._kw = {} if devices is None else {"devices": tuple(devices)}
        self.devices = devices

    @staticmethod
    def _f_order(x):
        """cuBLASXt takes Fortran-ordered host arrays; strided views (rare: original's split B) are copied."""
        return x if x.flags.f_contiguous else np.asfortranarray(x)

    def herk(self, alpha, a, beta, c, trans="C"):
        return self._f["herk"](alpha, self._f_order(a), beta, c, trans=trans, lower=True, **self._kw)

    def her2k(self, alpha, a, b, beta, c, trans="C"):
        f = self._f_order
        return self._f["her2k"](alpha, f(a), f(b), beta, c, trans=trans, lower=True, **self._kw)

    def herkx(self, alpha, a, b, beta, c, trans="C"):
        f = self._f_order
        return self._f["herkx"](alpha, f(a), f(b), beta, c, trans=trans, lower=True, **self._kw)

    def gemm(self, alpha, a, b, beta, c, transa="N", transb="N"):
        f = self._f_order
        return self._f["gemm"](alpha, f(a), f(b), beta, c, transa=transa, transb=transb, **self._kw)


def get_backend(blas="hybridblas", context=None, gpus=None):
    """``gpus``: GPU ids for cuBLASXt (None: the peer's default, GPU 0)."""
    if blas == "hybridblas":
        return HybridBackend(context)
    if blas == "cublasxt":
        return PeerBackend("cublasxt", gpus)
    raise ValueError(f"blas must be one of {BACKENDS}, got {blas!r}")
