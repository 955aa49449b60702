"""``flashrt``: the command line. Subcommands are added by the parts that own them."""

from __future__ import annotations

import argparse

from flashrt import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashrt", description="NVFP4 seats for vLLM, delivered on Kubernetes.")
    parser.add_argument("--version", action="version", version=f"flashrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="seat NVFP4 kernels into a small generated model and print the seat table")
    demo.add_argument("--tokens", type=int, default=24, help="tokens to generate greedily")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from flashrt.demo import main as demo_main

        return demo_main(tokens=args.tokens)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
