import sys

from .cli._cli import run

if __name__ == "__main__":  # guarded: importing the module (a test, a tool) runs nothing
    sys.exit(run())
