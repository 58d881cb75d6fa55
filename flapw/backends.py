"""Where the large products go: hybridblas (default) or a peer with the same call signature.

Every backend exposes herk, her2k, herkx and gemm with hybridblas's (= scipy.linalg.blas's) argument
order.  "cublasxt" looks for ``hybridblas.peers.cublasxt_{herk,her2k,herkx,gemm}`` (the same signature,
no ``context``): the paper's comparison of the same build with every BLAS call sent to cuBLASXt.
"""
import importlib

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

    def __init__(self, prefix):
        try:
            peers = importlib.import_module("hybridblas.peers")
        except ImportError as exc:
            raise BackendUnavailable(f"blas={prefix!r} needs hybridblas.peers, which is not available ({exc})") from None
        names = ("herk", "her2k", "herkx", "gemm")
        missing = [f"{prefix}_{n}" for n in names if not hasattr(peers, f"{prefix}_{n}")]
        if missing:
            raise BackendUnavailable(f"blas={prefix!r}: hybridblas.peers lacks {', '.join(missing)}")
        self.name = prefix
        self.context = None
        self._f = {n: getattr(peers, f"{prefix}_{n}") for n in names}

    def herk(self, alpha, a, beta, c, trans="C"):
        return self._f["herk"](alpha, a, beta, c, trans=trans, lower=True)

    def her2k(self, alpha, a, b, beta, c, trans="C"):
        return self._f["her2k"](alpha, a, b, beta, c, trans=trans, lower=True)

    def herkx(self, alpha, a, b, beta, c, trans="C"):
        return self._f["herkx"](alpha, a, b, beta, c, trans=trans, lower=True)

    def gemm(self, alpha, a, b, beta, c, transa="N", transb="N"):
        return self._f["gemm"](alpha, a, b, beta, c, transa=transa, transb=transb)


def get_backend(blas="hybridblas", context=None):
    if blas == "hybridblas":
        return HybridBackend(context)
    if blas == "cublasxt":
        return PeerBackend("cublasxt")
    raise ValueError(f"blas must be one of {BACKENDS}, got {blas!r}")
