"""Seats: find, bind, guard, adjudicate and detach NVFP4 kernels in a live model."""
