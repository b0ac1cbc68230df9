"""Shared helpers of the kit's own tests."""
from kit.fixture import fixtures_for


def make_fixture(case, device="cpu"):
    """One installed fixture, built as the runner builds them."""
    fx = fixtures_for([case], device)[0]
    fx.install()
    return fx
