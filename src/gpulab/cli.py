"""``gpulab``: the command line for users (jobs now). Written in the next commit."""


def main() -> int:
    raise SystemExit("gpulab: not written yet")
