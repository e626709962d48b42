"""Types of the compiled record writer (engine_hooks/_ring_writer.c); recorder.py checks its constants at import."""

from typing_extensions import Buffer  # collections.abc.Buffer is 3.12+; a stub only, never imported

from gatherwise.engine_hooks.call_marks import CallMarks

FORMAT_VERSION: int
HEADER_SIZE: int
RECORD_SIZE: int
WRITE_INDEX_OFFSET: int
COUNTERS_OFFSET: int
NUM_OPS: int
NUM_MODE_ROWS: int
TOPP_ROWS_OFFSET: int
TAG_SHIFT: int
MARKS: tuple[str, ...]
MODES: tuple[tuple[str, int], ...]
MODE_FIRST_OPS: tuple[int, ...]
MODE_SECOND_FLAGS: tuple[int, ...]

class Writer:
    def __init__(self, buffer: Buffer, capacity: int, vocab: int, rank: int, dtype: int,
                 marks_type: type[CallMarks], /) -> None: ...
    def record(self, marks: CallMarks, /) -> None:
        """One call's marks (as RingRecorder.record)."""
    def release(self) -> None:
        """Release the buffer (before closing the mmap)."""
