"""Fixtures of the tests that drive a gateway with the `openai` package: `served` (a module's
1 prefill + 1 decode tiny-model cluster and its gateway) and `client` (an `openai.OpenAI` on it).
A module that defines its own fixture of either name uses its own."""

from __future__ import annotations

import openai
import pytest

from tests.integration.gateway_helpers import gateway_cluster


@pytest.fixture(scope="module")
def served():
    with gateway_cluster() as (cluster, gateway):
        yield cluster, gateway


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[1].url + "/v1", api_key="unused", max_retries=0, timeout=60)
