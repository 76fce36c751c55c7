"""`TYPE_CHECKING`, false at run time, without importing `typing` (which `plan` and `--version` never import: about
2 ms of their start-up; see gatekeeper/__init__.py). Type checkers treat the name as true."""

TYPE_CHECKING = False
