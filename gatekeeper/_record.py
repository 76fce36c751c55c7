"""`Record`: equality, hashing and a repr over a class's `__slots__`, for the small value classes `plan` starts with.
A dataclass builds its methods by `exec` when its module is imported: about 1.3 ms a class, a fifth of `plan`'s
start-up beyond a bare loop's, where these classes are made a few times a run."""

from __future__ import annotations


class Record:
    __slots__: tuple[str, ...] = ()

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"
