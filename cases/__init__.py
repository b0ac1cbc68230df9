"""The in-box case catalog: one file per mode (`cases/<mode>.py`) and the recurrent kinds' file
(`cases/linear.py`, every mode), one line per case, each in a `smoke` set (CPU, CI) and a `full` set (GPU)."""
from kit.engine.catalog import Catalog

CATALOG = Catalog.from_package(__name__, recurrent="linear")
