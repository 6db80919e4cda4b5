"""Reliability tests share the serving fixtures (model repositories exported once per session)."""

from tests.serving.conftest import shipped_repository, tiny_repository  # noqa: F401
