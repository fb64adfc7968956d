"""``MemoryObjectStore`` through the ``ObjectStore`` contract (small parts, so fast)."""

from __future__ import annotations

import pytest

from replicator.core.storage import MemoryObjectStore
from tests.contract.object_store import ObjectStoreContract


class TestMemoryObjectStore(ObjectStoreContract):
    @pytest.fixture(autouse=True)
    def _store(self) -> None:
        self.part_size = 64 * 1024
        self.copy_threshold = 64 * 1024
        self.memory = MemoryObjectStore("mem-bucket", part_size=self.part_size)
        self.store = self.memory
        self.other = MemoryObjectStore("mem-other", part_size=self.part_size)

    def open_uploads(self) -> int:
        return len(self.memory.uploads_open)
