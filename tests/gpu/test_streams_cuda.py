"""Streams that must run side by side are distinct CUDA streams (`specbench.models.graphs.distinct_stream`):
PyTorch hands out pooled streams round-robin, so a plain `torch.cuda.Stream()` can be the very stream
another one, or graph capture's default, already is; library scratch (cuBLAS's workspace) is kept per
stream, and two graphs captured on one stream race when replayed beside each other."""

from __future__ import annotations

import pytest
import torch

from specbench.models.graphs import distinct_stream, graph_capture_stream

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_plain_streams_repeat_and_distinct_ones_do_not() -> None:
    first = torch.cuda.Stream()
    seen = [torch.cuda.Stream().cuda_stream for _ in range(40)]
    assert first.cuda_stream in seen, "the premise: PyTorch's stream pool hands a stream out again"
    for _ in range(40):
        assert distinct_stream(None, [first]).cuda_stream != first.cuda_stream


def test_pipeline_side_stream_is_not_the_capture_stream() -> None:
    from specbench.drafters.jetspecpp.pipeline import Pipeline

    capture = graph_capture_stream()
    for _ in range(40):
        side = Pipeline(torch.device("cuda", torch.cuda.current_device()), "concurrent").side
        assert side is not None and side.cuda_stream != capture.cuda_stream
