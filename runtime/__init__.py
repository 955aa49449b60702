"""Seats: find, bind, guard, adjudicate and detach NVFP4 kernels in a live model.

``attach(model, profile) -> Handle``; ``Handle.detach()`` gives the model back bit for bit.
"""

from flashrt.runtime.profile import SeatProfile, from_env
from flashrt.runtime.seats import Handle, SeatSpec, attach, discover

__all__ = ["Handle", "SeatProfile", "SeatSpec", "attach", "discover", "from_env"]
