"""The pip settings in force here, as ``uv pip install`` arguments (printed on one line).

uv reads no pip configuration, so ``make install`` hands it what ``pip config list`` shows (the
configuration files and ``PIP_*`` variables): the index, extra indexes, find-links locations and
constraint files, each as uv's flag. Later lines win, as for pip (a variable over a file). Run
with the venv's Python, whose pip reads the same files the fallback ``pip install`` would.
"""

from __future__ import annotations

import ast
import subprocess
import sys

FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def settings(listing: str) -> dict[str, list[str]]:
    """``pip config list`` lines (``global.find-links='/opt/wheels'``) -> values per setting."""
    found: dict[str, list[str]] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        name = key.rpartition(".")[2]
        if sep and name in FLAGS:
            try:
                found[name] = str(ast.literal_eval(value)).split()
            except (ValueError, SyntaxError):
                continue
    return found


def main() -> None:
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    args = [f"{FLAGS[name]}={value}" for name, values in settings(listing).items() for value in values]
    print(" ".join(args))


if __name__ == "__main__":
    main()
