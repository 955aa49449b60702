"""flashrt: NVFP4 weight kernels seated into running vLLM engines, on Kubernetes by one annotation."""

__version__ = "0.1.0"
