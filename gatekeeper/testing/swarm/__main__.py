"""`python -m gatekeeper.testing.swarm`: see the package's docstring. Run again with PYTHONHASHSEED=0 unless it is
set so: the order a set of strings is walked in is then the same in every process, and a seed replays exactly."""

import os
import sys

if __name__ == "__main__":  # (not on import: a walk over the package's modules imports this one too)
    if os.environ.get("PYTHONHASHSEED") != "0":
        again = [sys.executable, "-m", "gatekeeper.testing.swarm", *sys.argv[1:]]
        os.execve(sys.executable, again, {**os.environ, "PYTHONHASHSEED": "0"})  # noqa: S606 (this command, hash seed fixed)
    from . import main  # (after the hash seed is settled)

    raise SystemExit(main())
