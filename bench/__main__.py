"""``python -m bench [NAME ...] [-- ARGS]``: run the benchmarks (``make bench``).

Every ``bench/bench_<name>.py`` module with a ``main(argv) -> int`` is one
benchmark; with no NAME, all of them run one after another (never at once:
they would measure each other).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(
        m.name.removeprefix("bench_")
        for m in pkgutil.iter_modules([str(here)])
        if m.name.startswith("bench_")
    )


def main(argv: list[str]) -> int:
    names, rest = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    names = names or available()
    unknown = set(names) - set(available())
    if unknown:
        print(f"unknown benchmark(s): {', '.join(sorted(unknown))}; have: {', '.join(available())}")
        return 2
    status = 0
    for name in names:
        print(f"\n=== bench {name} ===", flush=True)
        status |= importlib.import_module(f"bench.bench_{name}").main(rest)
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
