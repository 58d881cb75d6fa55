"""Numbers read from environment variables, with errors that name the variable and its value."""
import os


def number(name, kind=int, minimum=None):
    """$name converted by ``kind`` (int or float); None when unset or empty. ValueError when it is not a
    number of that kind, or is below ``minimum``."""
    raw = os.environ.get(name)
    if not raw:
        return None
    what = "an integer" if kind is int else "a number"
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"${name} must be {what}, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"${name} must be {what} >= {minimum}, got {raw!r}")
    return value
