"""Where a checkout keeps what the package reads: the folders next to `bcr_core/`."""

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
NOTEBOOKS = CHECKOUT / "notebooks"
DATA = CHECKOUT / "data"
RESULTS = CHECKOUT / "results"
