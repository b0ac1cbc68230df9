"""The in-box case catalog: one file per mode (`cases/<mode>.py`), one line per case,
each in a `smoke` set (CPU, CI) and a `full` set (GPU)."""
from kit.engine.catalog import Catalog

CATALOG = Catalog.from_package(__name__)
