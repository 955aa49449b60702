"""``python -m flashrt.bench kernels [--quick] [--only linear|moe|quantize] [--out PATH]``."""

import sys


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in {"kernels"}:
        print("usage: python -m flashrt.bench kernels [--quick] [--only linear|moe|quantize] [--out PATH]")
        return 2
    from flashrt.bench import kernels

    return kernels.main(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
