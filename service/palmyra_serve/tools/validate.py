"""Placeholder: `palmyra-serve validate` is being written."""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8080")


def run(args: argparse.Namespace) -> int:
    raise SystemExit("not implemented yet")
