"""NVFP4 weight format and the Triton kernels that read it, each a torch custom op.

``quantize``/``dequantize`` and the checkpoint converters live in ``nvfp4``; ``linear`` and
``moe`` are the checked entry points (``ops``); one file per kernel holds its launcher and its
candidate configs; ``tuning`` picks among them by measurement on the device.
"""

from flashrt.kernels.nvfp4 import (
    NVFP4Weight,
    absolute_max,
    dequantize,
    from_compressed_tensors,
    from_modelopt,
    quantize,
    quantize_reference,
    to_compressed_tensors,
    to_modelopt,
)
from flashrt.kernels.ops import (
    linear,
    linear_add_norm,
    linear_normed,
    linear_reference,
    linear_silu_mul,
    moe,
    moe_reference,
)

__all__ = [
    "NVFP4Weight",
    "absolute_max",
    "dequantize",
    "from_compressed_tensors",
    "from_modelopt",
    "linear",
    "linear_add_norm",
    "linear_normed",
    "linear_reference",
    "linear_silu_mul",
    "moe",
    "moe_reference",
    "quantize",
    "quantize_reference",
    "to_compressed_tensors",
    "to_modelopt",
]
