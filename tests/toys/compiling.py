"""A backend that compiles a Triton kernel when it is made, one per head_dim (a constexpr), for an
sm90 target: Triton compiles for a GPU without one (ptxas ships with it), so a CPU machine sees a
real compile, or a hit in TRITON_CACHE_DIR where it compiled before."""
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from tests.toys.dense import DenseGraphBackend

TARGET = GPUTarget("cuda", 90, 32)


def _fill(out, n: tl.constexpr):
    tl.store(out + tl.arange(0, n), tl.arange(0, n).to(tl.float32))


# A JIT function though TRITON_INTERPRET is set (the in-box Triton backend sets it on CPU): compiled, not interpreted
_FILL = JITFunction(_fill)


def compile_for(head_dim: int):
    return triton.compile(ASTSource(_FILL, {"out": "*fp32"}, {"n": head_dim}), target=TARGET)


class CompilingBackend(DenseGraphBackend):
    name = "toy_compiling"

    def __init__(self, ctx):
        super().__init__(ctx)
        compile_for(ctx.layers[-1].head_dim)
