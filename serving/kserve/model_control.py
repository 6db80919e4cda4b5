"""KServe v2 / Triton ``RepositoryModelLoad`` and ``RepositoryModelUnload``: their checks.

The servicer hands a checked request to the server's ``serving.model_control.ModelControl``.
attnserve loads an entry's own ``config.yaml`` and graphs: Triton's load parameters ``config``
(a config override in JSON) and ``file:<path>`` (model files in the request) are refused with
INVALID_ARGUMENT, as is any other; an unload takes Triton's ``unload_dependents`` (a bool; an
attnserve model has no dependents, so it changes nothing).
"""

from __future__ import annotations

from collections.abc import Mapping

from serving.errors import FailedPrecondition, InvalidArgument
from serving.proto_gen.inference import grpc_service_pb2 as pb

OFF = (
    "model control is off on this server: start it with --model-control-mode explicit "
    "(set model_control_mode: explicit in server.yaml) to load and unload models while it runs"
)
UNLOAD_DEPENDENTS = "unload_dependents"


def off() -> FailedPrecondition:
    return FailedPrecondition(OFF)


def check_load_parameters(parameters: Mapping[str, pb.ModelRepositoryParameter]) -> None:
    """Raises InvalidArgument for any parameter (none is accepted), saying what to do."""
    for key in sorted(parameters):
        if key == "config" or key.startswith("file:"):
            raise InvalidArgument(
                f"load parameter {key[:100]!r} is not supported: attnserve loads the entry's own "
                "config.yaml and graphs from the repository; change them there (`attnserve "
                "export ... --force`) and load the model again"
            )
        raise InvalidArgument(
            f"unknown load parameter {key[:100]!r}; RepositoryModelLoad takes no parameters"
        )


def check_unload_parameters(parameters: Mapping[str, pb.ModelRepositoryParameter]) -> None:
    """Raises InvalidArgument for a parameter other than a bool ``unload_dependents``."""
    for key in sorted(parameters):
        if key != UNLOAD_DEPENDENTS:
            raise InvalidArgument(
                f"unknown unload parameter {key[:100]!r}; RepositoryModelUnload takes only "
                f"{UNLOAD_DEPENDENTS!r} (bool)"
            )
        kind = parameters[key].WhichOneof("parameter_choice")
        if kind != "bool_param":
            raise InvalidArgument(
                f"unload parameter {UNLOAD_DEPENDENTS!r} must be a bool (bool_param), got "
                f"{kind or 'no value'}"
            )
