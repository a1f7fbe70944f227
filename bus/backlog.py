"""What an endpoint holds while it is not registered: messages to send once the broker answers.

Contract (plain data): `Backlog(max_messages)`; `push(frames, request_id=None) -> dropped request
id | None` appends, pushing the oldest message out when full (it returns the request id of a
REQUEST pushed out, whose stream the caller must end); `holds_request(request_id)` says whether a
REQUEST is still here, i.e. has never reached any broker (READY must not announce it as pending);
`withdraw(request_id) -> bool` takes a REQUEST back (a cancel before it left); `take_all()`
empties it in order (`take_entries()` with the request ids, for a hand-over to another broker).
"""

from __future__ import annotations

from collections import deque


class Backlog:
    def __init__(self, max_messages: int) -> None:
        self.max_messages = max_messages
        self._messages: deque[tuple[str | None, list]] = deque()
        self._requests: set[str] = set()
        self.num_dropped = 0

    def __len__(self) -> int:
        return len(self._messages)

    def push(self, frames: list, request_id: str | None = None) -> str | None:
        dropped = None
        if len(self._messages) >= self.max_messages:
            self.num_dropped += 1
            dropped, _ = self._messages.popleft()
            self._requests.discard(dropped)
        self._messages.append((request_id, frames))
        if request_id is not None:
            self._requests.add(request_id)
        return dropped

    def holds_request(self, request_id: str) -> bool:
        return request_id in self._requests

    def withdraw(self, request_id: str) -> bool:
        if request_id not in self._requests:
            return False
        self._requests.discard(request_id)
        self._messages = deque(entry for entry in self._messages if entry[0] != request_id)
        return True

    def take_entries(self) -> list[tuple[str | None, list]]:
        """Empty it in order, as `(request id or None, frames)`: to send through another broker."""
        entries = list(self._messages)
        self._messages.clear()
        self._requests.clear()
        return entries

    def take_all(self) -> list[list]:
        messages = [frames for _, frames in self._messages]
        self._messages.clear()
        self._requests.clear()
        return messages
