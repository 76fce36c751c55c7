"""The version, in a module of its own: the parser reads it without loading the package's names."""

__version__ = "0.2.0"
