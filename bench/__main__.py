"""usage: python -m flashrt.bench kernels [--quick] [--only linear|moe|quantize] [--out PATH] | --merge [RESULT ...]
python -m flashrt.bench seats [--layers N] [--tokens N] [--out PATH]
python -m flashrt.bench e2e [--models a,b] [--layers N] [--batches 1,4,...] [--out PATH]
python -m flashrt.bench plot-e2e [RESULT ...] [PNG]
python -m flashrt.bench breakdown [RESULT ...]
python -m flashrt.bench prefill [--out PATH]
python -m flashrt.bench host [--features N] [--calls N] [--out PATH]
python -m flashrt.bench webhook [...]"""

import importlib
import sys

# Each subcommand's module in flashrt.bench; imported only when asked for (most need torch).
SUBCOMMANDS = {
    "kernels": "kernels",
    "seats": "seats",
    "e2e": "e2e",
    "plot-e2e": "plot_e2e",
    "breakdown": "breakdown",
    "prefill": "prefill",
    "host": "host",
    "webhook": "webhook",
}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in SUBCOMMANDS:
        print(__doc__)
        return 2
    return importlib.import_module(f"flashrt.bench.{SUBCOMMANDS[sys.argv[1]]}").main(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
