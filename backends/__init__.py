"""In-box backends: a new backend is one file here plus one line below."""

BUILTIN = {
    "torch_native": "backends.torch_native:TorchNativeBackend",
    "flashinfer": "backends.flashinfer:FlashInferBackend",
    "triton": "backends.triton:TritonBackend",
}
