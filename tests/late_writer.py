"""A kernel the PDL tests launch before the one they check, in the suite and in the processes some
of them start (``tests/`` on their path)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, globaltimer


@triton.jit
def late_writer(src_ptr, dst_ptr, ns, n, BLOCK: tl.constexpr):
    """Lets its PDL dependents start at once (``gdc_launch_dependents``), then spins ``ns``
    nanoseconds and only then writes the ``n`` elements of ``dst`` (one program, ``BLOCK`` the
    power of two at or above ``n``)."""
    gdc_launch_dependents()
    start = globaltimer()
    while globaltimer() - start < ns:
        pass
    offs = tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)
