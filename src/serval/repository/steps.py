"""A pipeline's steps as the registry sees them: the models they run on (read from the
pipeline's config), loops among pipelines, and whether every step's model serves now."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from serval.errors import ConfigError, ModelNotFound
from serval.model_config import PipelineStep
from serval.repository.overrides import LoadOverride, model_directory
from serval.repository.served import ModelState, ServedModel

StepsOf = Callable[[str], list[PipelineStep]]
GetModel = Callable[[str, str | None], ServedModel]
Declared = tuple[dict[str, str], dict[str, str]]  # a pipeline's inputs, outputs: name -> datatype


def check_step_tensors(name: str, steps: list[PipelineStep], get: GetModel,
                       declared: Declared | None = None) -> None:
    """ConfigError when a step maps an input or output its model does not have, or takes a
    tensor in another datatype than the step that makes it or the pipeline's config declares
    it, or makes a pipeline output in another than declared (Triton refuses such an ensemble
    at load), naming the step, the tensors and the model's own ones. `declared`: the
    pipeline's own inputs and outputs (name -> datatype).
    Checked once the steps' models have loaded; a step whose model holds no loaded version
    now (evicted) is checked at its next load."""
    inputs, outputs = declared or ({}, {})
    # pipeline tensor -> (datatype, who says so)
    made = {tensor: (datatype, "the pipeline's config declares it")
            for tensor, datatype in inputs.items()}
    for index, step in enumerate(steps, start=1):
        try:
            model = get(step.model, step.version).model
        except ModelNotFound:
            continue  # the load of the steps said so
        if model is None:
            continue
        metadata = model.metadata
        for kind, mapped, specs in (("input", step.inputs, metadata.inputs),
                                    ("output", step.outputs, metadata.outputs)):
            own = [spec.name for spec in specs]
            unknown = [tensor for tensor in mapped if tensor not in own]
            if unknown:
                listed = ", ".join(f"'{tensor}'" for tensor in unknown)
                raise ConfigError(
                    f"pipeline '{name}' step {index} ('{step.model}') maps {kind} {listed}, "
                    f"which model '{step.model}' does not have (its {kind}s: "
                    f"{', '.join(repr(tensor) for tensor in own) or 'none'})")
        where = f"pipeline '{name}' step {index} ('{step.model}')"
        for spec in metadata.inputs:  # a datatype the step before made differently
            tensor = step.inputs.get(spec.name)
            if tensor in made and made[tensor][0] != spec.datatype:
                datatype, maker = made[tensor]
                raise ConfigError(f"{where} takes '{tensor}' as input '{spec.name}' of "
                                  f"{spec.datatype}, but {maker} {datatype}")
        for spec in metadata.outputs:
            if spec.name in step.outputs:
                tensor = step.outputs[spec.name]
                made[tensor] = spec.datatype, f"step {index} ('{step.model}') makes it"
                if tensor in outputs and outputs[tensor] != spec.datatype:
                    raise ConfigError(
                        f"{where} makes pipeline output '{tensor}' as {spec.datatype} (its "
                        f"output '{spec.name}'), but the pipeline's config declares it "
                        f"{outputs[tensor]}")


class StepNotReady(ConfigError):
    """A pipeline step's model cannot serve: the log names it, clients do not learn it (the
    reason they see is `public`)."""

    def __init__(self, message: str, public: str) -> None:
        super().__init__(message)
        self.public = public


def steps_of(root: Path, name: str, override: LoadOverride | None) -> list[PipelineStep]:
    """The steps a model's config lists, with the load override in force ([] for a model
    that is no pipeline, or whose config is broken: its own load reports that)."""
    return pipeline_of(root, name, override)[0]


def pipeline_of(root: Path, name: str, override: LoadOverride | None
                ) -> tuple[list[PipelineStep], Declared]:
    """A pipeline's steps and its declared inputs and outputs (name -> datatype), with the
    load override in force (nothing for a model that is no pipeline or whose config is broken:
    its own load reports that)."""
    directory = model_directory(root, name, override)
    if directory is None:
        return [], ({}, {})
    try:
        config = override.config(directory) if override else directory.config()
    except ConfigError:
        return [], ({}, {})
    return list(config.steps), ({spec.name: spec.datatype for spec in config.inputs},
                                {spec.name: spec.datatype for spec in config.outputs})


def steps_while_loading(name: str, own: list[PipelineStep], steps_of: StepsOf,
                        versions_of: Callable[[str], Iterable[ServedModel]]) -> StepsOf:
    """The steps each model may run while `name` loads with `own`: any other model's config's
    and those its ready versions run (their loaded config's, which a config edited since, not
    yet reloaded, no longer shows)."""
    def steps(model: str) -> list[PipelineStep]:
        if model == name:
            return own
        return steps_of(model) + [step for served in versions_of(model)
                                  if served.state is ModelState.READY and served.spec
                                  for step in served.spec.config.steps]
    return steps


def check_no_loop(name: str, steps: StepsOf) -> None:
    """ConfigError when a pipeline's steps lead back to a pipeline on the way (its load would
    wait on itself). Each model is walked once, however many steps name it (a walk of every
    path took exponential time: pipelines of 100 steps nested three deep, minutes)."""
    done: set[str] = set()  # walked: no loop through these

    def visit(trail: tuple[str, ...]) -> None:
        for model in dict.fromkeys(step.model for step in steps(trail[-1])):
            if model in trail:
                raise ConfigError(f"pipeline steps loop: {' -> '.join((*trail, model))}")
            if model not in done:
                visit((*trail, model))
        done.add(trail[-1])
    visit((name,))


def unready_steps(served: ServedModel, get: GetModel) -> list[str]:
    """Why a loaded pipeline cannot serve now: each step whose model is not ready (an evicted
    one reloads on demand, so it counts as serving); [] for any other model. Each model
    version is looked at once, however many steps name it."""
    problems: list[str] = []
    seen = {id(served)}
    pending = [served]
    while pending:
        pipeline = pending.pop(0)
        if pipeline.spec is None:
            continue
        for index, step in enumerate(pipeline.spec.config.steps, start=1):
            try:
                model = get(step.model, step.version)
            except ModelNotFound as exc:
                problems.append(f"step {index} ('{step.model}'): {exc.message}")
                continue
            if model.state not in (ModelState.READY, ModelState.EVICTED):
                problems.append(f"step {index} ('{step.model}'): version {model.version} is "
                                f"{model.state.value}: {model.reason}")
            elif id(model) not in seen:
                seen.add(id(model))
                pending.append(model)
    return problems


def step_models(name: str, steps_of: StepsOf) -> list[str]:
    """The models a pipeline's steps run on, nested pipelines' too, each once (Triton's
    composing models); [] for any other model."""
    found: list[str] = []
    pending = [step.model for step in steps_of(name)]
    while pending:
        model = pending.pop(0)
        if model not in found and model != name:
            found.append(model)
            pending += [step.model for step in steps_of(model)]
    return found
