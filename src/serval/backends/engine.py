"""What makes an engine a Backend: its versions are loaded (in a child process with
`isolation: process`), warmed up and batched by the registry's serve context."""

from __future__ import annotations

from serval.backends.base import Engine, LoadedModel, ModelVersionSpec, ServeContext, Served
from serval.backends.isolated import IsolatedBackend


class EngineBackend:
    """The serve() every engine shares; subclasses provide name and load()."""

    name: str

    def load(self, spec: ModelVersionSpec) -> LoadedModel:
        raise NotImplementedError

    async def serve(self, spec: ModelVersionSpec, context: ServeContext) -> Served:
        engine: Engine = IsolatedBackend(self) if spec.config.isolation == "process" else self
        return await context.batch_engine(engine, spec)
