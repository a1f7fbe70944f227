"""API keys and rate limits (nodes/gateway/protect.py) on a fake clock."""

import pytest

from nodes.gateway.api_errors import ApiError
from nodes.gateway.protect import RateLimiter, check_api_key


def test_no_keys_configured_means_no_authentication():
    assert check_api_key(None, ()) == ""


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic abc", "Bearer wrong"])
def test_a_missing_or_wrong_key_is_401(header):
    with pytest.raises(ApiError) as info:
        check_api_key(header, ("k1", "k2"))
    assert info.value.status == 401 and info.value.code == "invalid_api_key"


def test_a_valid_bearer_key_is_its_identity():
    assert check_api_key("Bearer k2", ("k1", "k2")) == "k2"


def test_the_token_bucket_refuses_past_the_burst_with_retry_after(clock):
    limiter = RateLimiter(rps=2.0, burst=2)
    for _ in range(2):
        limiter.acquire("a", clock())
        limiter.release("a")
    with pytest.raises(ApiError) as info:
        limiter.acquire("a", clock())
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "1"
    limiter.acquire("b", clock())   # per identity
    clock.advance(0.5)
    limiter.acquire("a", clock())   # one token refilled


def test_concurrent_streams_are_limited_per_identity(clock):
    limiter = RateLimiter(max_streams=1)
    limiter.acquire("a", clock())
    with pytest.raises(ApiError) as info:
        limiter.acquire("a", clock())
    assert info.value.status == 429
    limiter.release("a")
    limiter.acquire("a", clock())


def test_zero_means_unlimited(clock):
    limiter = RateLimiter()
    for _ in range(1000):
        limiter.acquire("a", clock())
