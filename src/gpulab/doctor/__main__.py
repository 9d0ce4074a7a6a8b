"""``python -m gpulab.doctor [--config FILE] [--json] [--users N]`` (also ``gpulab doctor``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .checks import check_all, check_config, exit_code, render, to_json
from .gather import ConfigUnreadable, config_path, gather, read_settings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="gpulab doctor",
        description="Check what a gpulab deployment needs of this host, with the hub's own "
        "configuration: the engine and its GPU runtimes, the NVIDIA driver and each GPU, the "
        "images, the object stores, the address pools, the database and the proxy.",
        epilog="Exit status: 0 no error (warnings allowed), 1 an error, 2 bad usage.",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="the hub's jupyterhub_config.py (default: $GPULAB_CONFIG_FILE, else "
        "./jupyterhub_config.py)",
    )
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument(
        "--users",
        type=int,
        metavar="N",
        help="users that may hold a notebook or job at once (default: JupyterHub's "
        "active_server_limit, else 50): the networks the address pools must hold",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # what the site's configuration file and the engine's client log stays out of the report
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    path = args.config or ""
    try:
        path = config_path(args.config)
        settings, config = read_settings(path)
        facts = gather(settings, config, path, args.users)
    except ConfigUnreadable as e:
        findings = [check_config(path, str(e))]
    else:
        summary = (
            f"runtime {settings.runtime}, gpu_mode {settings.gpu_mode}, "
            f"instance {settings.instance}"
        )
        findings = check_all(facts, summary)
    if args.json:
        print(json.dumps(to_json(findings), indent=2))
    else:
        sys.stdout.write(render(findings))
    return exit_code(findings)


if __name__ == "__main__":
    raise SystemExit(main())
