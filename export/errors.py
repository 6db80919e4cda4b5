"""Typed export errors: each message says what went wrong and what to do."""


class ExportError(RuntimeError):
    """Export failed (torch.onnx, the checker, a parity check); the message says why."""


class SourceError(ValueError):
    """The export SOURCE is not a known kind, checkpoint or Hugging Face directory."""


class DestinationError(ValueError):
    """The output location cannot be used (exists without --force, not writable)."""
