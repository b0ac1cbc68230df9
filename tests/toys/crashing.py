"""A backend that kills its process (as a device fault would) on batches of 3 requests."""
import os

from backends.torch_native import TorchNativeBackend


class HardCrashBackend(TorchNativeBackend):
    name = "toy_hard_crash"

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if batch.batch_size == 3:
            os._exit(3)
        return super().forward(q, k, v, layer, batch, save_kv_cache)
