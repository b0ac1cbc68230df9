"""A backend that records its builds: each construction appends its kernel variant, process and
torch's threads to the file $KIT_TOY_BUILDS, then waits (up to WAIT_S, $KIT_TOY_BUILD_WAIT_S) for a second build to have started, which
only builds running at once see. It prints as it builds, as compilers do."""
import os
import time

import torch

from tests.toys.dense import DenseGraphBackend

WAIT_S = float(os.environ.get("KIT_TOY_BUILD_WAIT_S", 30))


def _builds(path):
    with open(path) as f:
        return f.read().splitlines()


class RecordingBackend(DenseGraphBackend):
    name = "toy_recording"

    def __init__(self, ctx):
        super().__init__(ctx)
        layer = ctx.layers[-1]
        path = os.environ["KIT_TOY_BUILDS"]
        print(f"building d{layer.head_dim} p{ctx.page_size}", flush=True)
        with open(path, "a") as f:
            f.write(f"{str(ctx.dtype).replace('torch.', '')} d{layer.head_dim} "
                    f"g{layer.tp_q_head_num // layer.tp_k_head_num} p{ctx.page_size} pid {os.getpid()} "
                    f"threads {torch.get_num_threads()}\n")
        deadline = time.monotonic() + WAIT_S
        while len(_builds(path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(path + ".overlap", "a") as f:
            f.write("together\n" if len(_builds(path)) >= 2 else "alone\n")
