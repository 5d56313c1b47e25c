"""Where the drafter runs: its own CUDA stream on CUDA, inline elsewhere.

The same worker code runs on both: ``with plan.draft(): ...`` then ``plan.join()`` before the
target consumes the drafts. On CPU both are no-ops. Today the worker joins right after drafting (the
verify reads the drafts), so the side stream orders the draft after the previous target pass but
overlaps nothing; the event design it is meant for is docs/gpu_path.md section 2 (planned).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class StreamPlan:
    kind: str  # "cuda-side-stream" | "inline"
    stream: object | None = None
    done: object | None = None

    @classmethod
    def for_device(cls, device: str | torch.device) -> StreamPlan:
        if torch.device(device).type == "cuda" and torch.cuda.is_available():
            return cls("cuda-side-stream", torch.cuda.Stream(device=device), torch.cuda.Event())
        return cls("inline")

    @contextlib.contextmanager
    def draft(self) -> Iterator[None]:
        if self.stream is None:
            yield
            return
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)  # drafter reads KV written by the previous target pass
        with torch.cuda.stream(self.stream):
            yield
            self.done.record(self.stream)

    def join(self) -> None:
        if self.stream is not None:
            torch.cuda.current_stream().wait_event(self.done)
