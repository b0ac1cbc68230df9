"""A backend whose library is missing here, as FlashInfer's is without CUDA: it declines fp32 cases
for their dtype (most of the smoke set) and every other case for the missing library."""
from tests.toys.dense import DenseGraphBackend

MISSING = "toylib cannot be imported here (ModuleNotFoundError: No module named 'toylib'); pip install toylib"


class MissingLibraryBackend(DenseGraphBackend):
    name = "toy_missing_library"

    @classmethod
    def supports(cls, case):
        if case.dtype == "fp32":
            return "fp32: toylib's kernels take fp16/bf16 only"
        return MISSING
