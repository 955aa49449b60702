"""``flashrt``: the command line. Subcommands are added by the parts that own them."""

from __future__ import annotations

import argparse
import sys

from flashrt import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashrt", description="NVFP4 seats for vLLM, delivered on Kubernetes.")
    parser.add_argument("--version", action="version", version=f"flashrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="vllm serve a small generated MoE model with flashrt seated, and show the seats")
    demo.add_argument(
        "--engine", choices=("vllm", "transformers"), default="vllm",
        help="vllm: a real vllm serve with the plugin (default); transformers: attach to a transformers model",
    )  # fmt: skip
    demo.add_argument("--tokens", type=int, default=24, help="transformers: tokens to generate greedily")
    bundle = sub.add_parser("bundle", help="write the runtime bundle (package + vLLM plugin dist-info) into DIR")
    bundle.add_argument("dir")
    for name, text in (("inject", "print the manifests with flashrt injected into their vLLM pods"),
                       ("uninject", "print the manifests with exactly what inject added removed")):  # fmt: skip
        sub_parser = sub.add_parser(name, help=text)
        sub_parser.add_argument("-f", "--filename", required=True, help="manifest file, or - for standard input")
        if name == "inject":
            sub_parser.add_argument("--profile", help="a SeatProfile manifest (default: the default profile)")
    args = parser.parse_args(argv)
    if args.command == "bundle":
        from flashrt.bundle import bundle as write_bundle

        print(write_bundle(args.dir))
        return 0
    if args.command in ("inject", "uninject"):
        from flashrt.operator.manifests import run

        try:
            return run(args.command, args.filename, getattr(args, "profile", None))
        except (OSError, ValueError) as exc:
            print(f"flashrt {args.command}: {exc}", file=sys.stderr)
            return 2
    if args.command == "demo" and args.engine == "vllm":
        from flashrt.serve_demo import main as serve_demo

        return serve_demo()
    if args.command == "demo":
        from flashrt.demo import main as demo_main

        return demo_main(tokens=args.tokens)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
