"""Guarded allocations catch a write past the end of a tensor the backend allocated."""
import torch

from kit.guard import Guard


def test_write_inside_is_fine_and_write_past_end_is_caught():
    guard = Guard()
    with guard.watching():
        t = torch.zeros(5, dtype=torch.int32)
        u = torch.empty(3, 2)
    t[:] = 7
    u.fill_(1.0)
    assert guard.check().ok
    t.as_strided((6,), (1,))[5] = 1  # one element past the end, as an index kernel running long would
    check = guard.check()
    assert not check.ok and "(5,) int32" in check.describe()


def test_values_and_shapes_survive_guarding():
    guard = Guard()
    with guard.watching():
        a = torch.arange(2, 9)
        b = torch.full((2, 3), 4.5)
        c = torch.zeros_like(b)
    assert a.tolist() == list(range(2, 9)) and torch.equal(b, torch.full((2, 3), 4.5)) and not c.any()
