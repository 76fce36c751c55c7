"""Microsoft Foundry (`https://{resource}.services.ai.azure.com/anthropic/`): it serves the Messages API and no
Message Batches (the SDK's `AnthropicFoundry` returns None for `messages.batches` and `models`: "Batches endpoint is
not supported"). Every gatekeeper command that would create or read batches is refused in one line, before any
setting of Foundry's is read or any call is made (`connect`); nothing else of the platform is needed yet (the deadline
lane may use its Messages API later)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ._config import ApiConfig
from ._platform import Platform

NO_BATCHES = ("Microsoft Foundry serves the Messages API but no Message Batches (the SDK's AnthropicFoundry has no "
              "batches: \"Batches endpoint is not supported\"): gatekeeper's jobs are batches, so nothing is sent; use "
              "--platform anthropic, aws or google")


class FoundryPlatform(Platform):
    """Microsoft Foundry: no batches (`batches` says why)."""

    name: ClassVar[str] = "foundry"
    title: ClassVar[str] = "Microsoft Foundry"
    batches: ClassVar[str | None] = NO_BATCHES

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FoundryPlatform)

    def __hash__(self) -> int:
        return hash(self.name)


def configure(environ: Mapping[str, str], api_version: str | None) -> ApiConfig:
    """Foundry, with nothing read: the refusal comes first (`connect`), whatever else is set or missing."""
    return ApiConfig(platform=FoundryPlatform(), api_version=api_version)
