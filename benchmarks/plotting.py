"""Shared by the plotting scripts (run as scripts: this folder is on sys.path)."""
import os


def save(fig, out):
    """Lay the figure out, write it (creating the folder) and print where it went."""
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)
