"""Where drafter work runs: its own CUDA stream on CUDA, inline elsewhere (torch only).

Two uses, the same object:
- The SGLang worker drafts block n under ``with plan.draft(): ...`` then ``plan.join()`` before the
  target consumes the drafts. Today the verify reads those drafts at once, so the side stream orders
  the draft after the previous target pass but overlaps nothing (docs/gpu_path.md section 2).
- The reference engine's pre-draft (issue #20) is event-ordered: once block n's drafts are enqueued,
  ``with plan.side(plan.mark()): ...`` enqueues the pre-draft of block n+1 on the side stream, which
  waits for that event only; the target's verify(n), enqueued on the main stream after it, runs
  concurrently; ``plan.join(outputs)`` makes the main stream wait for the side stream's work before
  it reads the outputs.
On CPU every method is a no-op and the code inside runs inline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch


@dataclass
class StreamPlan:
    kind: str  # "cuda-side-stream" | "inline"
    stream: object | None = None  # torch.cuda.Stream on CUDA
    done: object | None = None  # torch.cuda.Event recorded on the side stream after its last work

    @classmethod
    def for_device(cls, device: str | torch.device) -> StreamPlan:
        if torch.device(device).type == "cuda" and torch.cuda.is_available():
            return cls("cuda-side-stream", torch.cuda.Stream(device=device), torch.cuda.Event())
        return cls("inline")

    @contextlib.contextmanager
    def draft(self) -> Iterator[None]:
        """Side-stream work ordered after everything enqueued on the main stream so far (the drafter
        reads KV the previous target pass wrote)."""
        with self.side(self.mark()):
            yield

    def mark(self) -> object | None:
        """An event on the main stream now (None inline): what later side work may wait for."""
        if self.stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream())
        return ev

    @contextlib.contextmanager
    def side(self, ready: object | None) -> Iterator[None]:
        """Side-stream work ordered after ``ready`` only: main-stream work enqueued after the mark
        (the target's verify) runs concurrently with it."""
        if self.stream is None:
            yield
            return
        self.stream.wait_event(ready)
        with torch.cuda.stream(self.stream):
            yield
            self.done.record(self.stream)

    def join(self, outputs: Iterable[torch.Tensor] = ()) -> None:
        """The main stream waits for the side stream's last work. ``outputs`` made on the side stream
        are marked as used by the main stream, so the caching allocator does not hand their memory to
        new side-stream work while main-stream kernels may still read it."""
        if self.stream is None:
            return
        main = torch.cuda.current_stream()
        main.wait_event(self.done)
        for t in outputs:
            t.record_stream(main)
