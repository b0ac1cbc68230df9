"""Backends that take their process down (as a device fault would) or hang, on batches of 3 requests."""
import os
import time

from backends.torch_native import TorchNativeBackend


class HardCrashBackend(TorchNativeBackend):
    name = "toy_hard_crash"

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if batch.batch_size == 3:
            os._exit(3)
        return super().forward(q, k, v, layer, batch, save_kv_cache)


class HangBackend(TorchNativeBackend):
    """Never returns on batches of 3 requests (stands for a hung kernel)."""

    name = "toy_hang"

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if batch.batch_size == 3:
            time.sleep(600)
        return super().forward(q, k, v, layer, batch, save_kv_cache)
