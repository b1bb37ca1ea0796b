"""Whether the model is being traced: the speed paths step aside while ``torch.export`` (ONNX export)
or ``torch.compile`` traces it, so that weights stay graph inputs and no data-dependent shape enters
the graph."""

from __future__ import annotations

import torch

__all__ = ["exporting", "tracing"]


def exporting() -> bool:
    """True while ``torch.export`` traces the model (``torch.compiler.is_exporting``, torch >= 2.7)."""
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    return is_exporting is not None and is_exporting()


def tracing() -> bool:
    """True while ``torch.export`` or ``torch.compile`` traces the model."""
    return exporting() or torch.compiler.is_compiling()
