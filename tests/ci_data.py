"""Where the cisolver tests read interaction files: $CISOLVER_DATA when set, else the files shipped in the
package (cisolver/data/interactions)."""
import os
from pathlib import Path

import pytest

from cisolver.data import packaged_interactions

DATA = Path(os.environ.get("CISOLVER_DATA") or packaged_interactions())
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"interaction data folder absent: {DATA} (set CISOLVER_DATA)")
