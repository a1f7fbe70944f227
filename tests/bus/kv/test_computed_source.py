"""A KV source still being computed (bus/kv/chunk_codec.py, `ready` / `when_ready`): the sans-I/O
sender sends the chunks whose KV is there, names the one it waits for without encoding it, keeps
taking ACKs meanwhile, goes on once told, and its transfer timeout covers a source that never
finishes (fake clock)."""

from __future__ import annotations

import numpy as np

from bus.kv.chunk_codec import ChunkEncoder
from bus.kv.layout import ChunkSpec
from bus.kv.quant import NumpyQuantizer
from bus.kv.send_core import SendConfig, SendState
from tests.bus.kv.conftest import synthetic_kv


class ComputedLayers(np.ndarray):
    """KV whose first `layers_done` layers are computed (attributes set on the array itself)."""

    def ready(self, spec: ChunkSpec) -> bool:
        per_layer = 2 * self.shape[2]
        return spec.plane_stop <= self.layers_done * per_layer

    def when_ready(self, spec: ChunkSpec, callback) -> None:
        self.asked.append(spec.plane_stop)
        if self.ready(spec):
            callback()


def computed(kv: np.ndarray, layers_done: int) -> ComputedLayers:
    source = kv.view(ComputedLayers)
    source.layers_done, source.asked = layers_done, []
    return source


def test_the_sender_waits_for_the_chunks_whose_kv_is_not_computed(make_pair, kv):
    source = computed(kv, 1)
    pair = make_pair(source, window=3)
    pair.run(steps=20)
    sender = pair.sender
    first_waiting = sender.waiting_for
    assert sender.state is SendState.SENDING and first_waiting is not None and not pair.results
    per_layer, specs = 2 * kv.shape[2], sender.encoder.specs
    assert specs[first_waiting].plane_stop > per_layer >= specs[first_waiting - 1].plane_stop   # layer 0's all sent
    assert not sender._in_flight   # every chunk of layer 0 was acknowledged while it waits
    assert sender.next_frames(pair.clock()) is None
    source.layers_done = 3
    assert sender.waiting_for is None and sender.encoder.ready(first_waiting)
    pair.run()
    [result] = pair.results
    assert result.ok and sender.state is SendState.DONE
    assert np.abs(result.kv - kv).max() < 0.1


def test_a_source_that_never_finishes_times_the_transfer_out(make_pair, kv):
    pair = make_pair(computed(kv, 0), send_config=SendConfig(transfer_timeout=1.0, ack_timeout=0.5))
    pair.pump_sender()
    assert not pair.wire and pair.sender.waiting_for == 0
    assert pair.sender.next_deadline() == pair.clock() + 1.0
    pair.clock.advance(1.5)
    pair.sender.poll(pair.clock())
    assert pair.sender.state is SendState.FAILED and pair.sender.timed_out


def test_any_other_kv_is_ready_at_once():
    encoder = ChunkEncoder(synthetic_kv(), NumpyQuantizer(), transfer_id="t", request_id="r", compression="none")
    told = []
    encoder.when_ready(0, lambda: told.append(0))
    assert encoder.ready(0) and told == [0]
    source = computed(synthetic_kv(), 0)
    encoder = ChunkEncoder(source, NumpyQuantizer(), transfer_id="t", request_id="r", compression="none")
    encoder.when_ready(0, lambda: told.append(1))
    assert not encoder.ready(0) and told == [0] and source.asked == [encoder.specs[0].plane_stop]
