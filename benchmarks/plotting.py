"""What the plots share: matplotlib loaded on demand, and one way to write a figure."""
import os
import sys


def pyplot(required=True):
    """matplotlib.pyplot on the Agg backend. Without matplotlib: a ValueError naming the pip extra when
    ``required``, else a note on stderr and None (a run whose plot is a by-product)."""
    try:
        import matplotlib
    except ImportError:
        message = "matplotlib is not installed: pip install 'hybridblas[plot]'"
        if required:
            raise ValueError(message) from None
        print(f"({message}; no plot)", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, out, dpi=110):
    """Lay the figure out, write it (creating the folder) and print where it went."""
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=dpi)
    print(f"plot: {out}", flush=True)
    return out
