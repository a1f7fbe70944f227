"""The gateway on the real model (SmolLM2-135M-Instruct, greedy, raw KV, 1 prefill + 1 decode
process): the `openai` package's chat completion, streamed and not, answers the question and
both agree; `pdbus client --chat --prompt` (what `make demo` runs) streams the same answer."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest

from harness.cluster_procs import REPO_ROOT
from tests.integration.gateway_helpers import gateway_cluster

pytestmark = [pytest.mark.integration, pytest.mark.real_model]
MODEL = "SmolLM2-135M-Instruct"
QUESTION = "What is the capital of France?"


def test_real_model_chat_through_the_gateway():
    with gateway_cluster(model=MODEL) as (_, gateway):
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        options = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, temperature=0)
        whole = client.chat.completions.with_raw_response.create(**options)
        answer = whole.parse().choices[0].message.content
        assert "Paris" in answer
        assert whole.headers["X-Pdbus-Decode-Node"] == "decode-0" and whole.headers["X-Pdbus-KV-Mode"] == "raw"
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True,
                                                                                                      **options))
        assert streamed == answer
        done = subprocess.run([sys.executable, "-m", "nodes.cli", "client", "--url", gateway.url, "--chat",
                               "--prompt", QUESTION, "--max-tokens", "16"], capture_output=True, text=True,
                              cwd=REPO_ROOT, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == answer.strip() and "decode decode-0" in done.stderr
