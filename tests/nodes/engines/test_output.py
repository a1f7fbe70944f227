"""Stop strings, stop ids, EOS and max_tokens on the tiny model's tokenizer."""

from __future__ import annotations

import pytest

from nodes.engines.base import SamplingParams
from nodes.engines.output import OutputTracker

EOS = 2


def run(tokenizer, text: str, **params) -> tuple[str, str | None, int]:
    tracker = OutputTracker(tokenizer, SamplingParams(**params), (EOS,))
    emitted, reason = "", None
    for token in tokenizer.encode(text):
        delta, reason = tracker.push(token)
        emitted += delta
        if reason:
            break
    return emitted, reason, tracker.num_tokens


def test_stop_string_cuts_text_before_it(tiny_model):
    text, reason, _ = run(tiny_model.tokenizer, "Hello world! How are you today?", stop=("How",))
    assert (text, reason) == ("Hello world! ", "stop")


def test_stop_string_spanning_tokens_is_found_and_never_emitted(tiny_model):
    tok = tiny_model.tokenizer
    text, reason, _ = run(tok, "The quick brown fox jumps", stop=("k bro",))
    assert (text, reason) == ("The quic", "stop")


def test_text_that_could_start_a_stop_string_is_held_back_until_the_end(tiny_model):
    text, reason, _ = run(tiny_model.tokenizer, "Paris is the capital", stop=("zzz",), max_tokens=1000)
    assert text == "Paris is the capit" and reason is None   # len("zzz") - 1 characters held back


def test_max_tokens_ends_with_length_and_releases_held_text(tiny_model):
    tok = tiny_model.tokenizer
    n = len(tok.encode("Good morning, good evening"))
    text, reason, count = run(tok, "Good morning, good evening", stop=("xyzzy",), max_tokens=n)
    assert (text, reason, count) == ("Good morning, good evening", "length", n)


def test_eos_and_stop_ids_end_with_stop_and_emit_no_text(tiny_model):
    tracker = OutputTracker(tiny_model.tokenizer, SamplingParams(stop_token_ids=(40,)), (EOS,))
    assert tracker.push(EOS) == ("", "stop")
    tracker = OutputTracker(tiny_model.tokenizer, SamplingParams(stop_token_ids=(40,)), (EOS,))
    assert tracker.push(40)[1] == "stop"


def test_ignore_eos_keeps_going(tiny_model):
    tracker = OutputTracker(tiny_model.tokenizer, SamplingParams(ignore_eos=True), (EOS,))
    assert tracker.push(EOS)[1] is None


def test_push_after_finish_is_an_error(tiny_model):
    tracker = OutputTracker(tiny_model.tokenizer, SamplingParams(max_tokens=1), (EOS,))
    assert tracker.push(40)[1] == "length"
    with pytest.raises(RuntimeError):
        tracker.push(40)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-1), dict(max_tokens=0),
                                 dict(stop=("",))])
def test_bad_sampling_params_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)
