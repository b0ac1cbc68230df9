"""A backend that writes its arguments after computing with them: torch_native, then q, k and
v zeroed in place. Its output and KV writes are right; the model's q/k/v are not
(kit.harness.checks.InputsCheck)."""
from backends.torch_native import TorchNativeBackend


class ScribblingBackend(TorchNativeBackend):
    name = "toy_scribbling"

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out = super().forward(q, k, v, layer, batch, save_kv_cache)
        for t in (q, k, v):
            t.zero_()
        return out
