"""A module that changes the process when imported (what no module of the kit may do): the
import-side-effect test plants it to show its probe sees such a change."""
import os

os.environ["KIT_TOY_IMPORTED"] = "1"
