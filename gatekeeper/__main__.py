import sys

from .cli._cli import run

if __name__ == "__main__":  # guarded: the parallel reader's spawned workers import this module
    sys.exit(run())
