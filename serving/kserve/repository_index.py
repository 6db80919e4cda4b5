"""KServe v2 / Triton ``RepositoryIndex``: the repository's models and their states.

A served model is READY while its scheduler runs (UNAVAILABLE, reason "not ready", otherwise); an
entry of the repository that is not served is listed as UNAVAILABLE with the reason (left out by
``--models`` / ``models:``, unloaded, or its load failed), as Triton lists the models it has not
loaded. attnserve
serves one repository: ``repository_name`` is empty, the repository's path or its folder name.
"""

from __future__ import annotations

from serving.errors import NotFound
from serving.kserve.triton_config import model_ready
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.repository import ModelRepository

READY, UNAVAILABLE = "READY", "UNAVAILABLE"


def repository_index(
    repository: ModelRepository, name: str, ready_only: bool
) -> pb.RepositoryIndexResponse:
    """The index of ``repository`` (only its ready models with ``ready_only``).

    Raises:
        NotFound: ``name`` is not this server's repository.
    """
    check_repository_name(repository, name)
    entry = pb.RepositoryIndexResponse.ModelIndex
    models: list[pb.RepositoryIndexResponse.ModelIndex] = [
        entry(name=m.name, version=str(m.version), state=READY)
        if model_ready(m)
        else entry(name=m.name, version=str(m.version), state=UNAVAILABLE, reason="not ready")
        for m in repository.models()
    ]
    models += [
        entry(name=name, state=UNAVAILABLE, reason=reason)
        for name, reason in repository.unserved().items()
    ]
    if ready_only:
        models = [m for m in models if m.state == READY]
    models.sort(key=lambda m: m.name)
    return pb.RepositoryIndexResponse(models=models)


def check_repository_name(repository: ModelRepository, name: str) -> None:
    """Raises NotFound unless ``name`` is empty, the repository's path or its folder name."""
    root = repository.root
    if name and (root is None or name not in (str(root), root.name)):
        served = f"{root.name!r} ({root})" if root is not None else "one repository"
        raise NotFound(
            f"no repository named {name[:100]!r}; this server serves {served}: send that name "
            "or leave repository_name empty"
        )
