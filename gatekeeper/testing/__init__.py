"""A fake Message Batches API for offline tests and rehearsals.

    from gatekeeper.testing import FakeAPI, FakeConfig, Fault, Outcome

    with FakeAPI(FakeConfig(ceiling=300_000, rate=5_000, speed=60)) as fake:
        ...  # point ANTHROPIC_BASE_URL at fake.url, use the keys in fake.config.workspaces
        assert fake.org.records.succeeded_twice == 0
"""

from ._aws import FakeAws
from ._google import FakeGoogle
from ._model import DEFAULT_MODELS, FakeConfig, FakeModel, FakeRealtime, Outcome, Records
from ._oauth import FakeFederation, FakeRule, identity_token
from ._server import FakeAPI, Fault, fake_token_count, prompt_of

__all__ = ["DEFAULT_MODELS", "FakeAPI", "FakeAws", "FakeConfig", "FakeFederation", "FakeGoogle", "FakeModel", "FakeRealtime",
           "FakeRule", "Fault", "Outcome", "Records", "fake_token_count", "identity_token", "prompt_of"]
