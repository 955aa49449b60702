"""usage: python -m flashrt.bench kernels [--quick] [--only linear|moe|quantize] [--out PATH] | --merge [RESULT ...]
python -m flashrt.bench seats [--layers N] [--tokens N] [--out PATH]
python -m flashrt.bench e2e [--models a,b] [--layers N] [--batches 1,4,...] [--out PATH]
python -m flashrt.bench plot-e2e [RESULT ...] [PNG]
python -m flashrt.bench prefill [--out PATH]
python -m flashrt.bench host [--features N] [--calls N] [--out PATH]
python -m flashrt.bench webhook [...]"""

import sys


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in {"kernels", "seats", "e2e", "plot-e2e", "prefill", "host", "webhook"}:
        print(__doc__)
        return 2
    if sys.argv[1] == "webhook":
        from flashrt.bench import webhook

        return webhook.main(sys.argv[2:])
    if sys.argv[1] == "host":
        from flashrt.bench import host

        return host.main(sys.argv[2:])
    if sys.argv[1] == "prefill":
        from flashrt.bench import prefill

        return prefill.main(sys.argv[2:])
    if sys.argv[1] == "plot-e2e":
        from flashrt.bench import plot_e2e

        return plot_e2e.main(sys.argv[2:])
    if sys.argv[1] == "e2e":
        from flashrt.bench import e2e

        return e2e.main(sys.argv[2:])
    if sys.argv[1] == "seats":
        from flashrt.bench import seats

        return seats.main(sys.argv[2:])
    from flashrt.bench import kernels

    return kernels.main(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
