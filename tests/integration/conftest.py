"""One secured broker for the session (SASL_SSL, SCRAM, ACLs), for ``test_secured_broker`` and ``test_refused``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .secured import Secured, start_secured


@pytest.fixture(scope="session")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    yield from start_secured(tmp_path_factory.mktemp("kafka-secured"))
