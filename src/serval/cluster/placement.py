"""Tells Ray Serve's router which models a replica holds, from Serval's registry.

Ray's `@serve.multiplexed` evicts by model count and loads one model at a time; Serval's registry
evicts by bytes and loads concurrently. So the registry stays in charge and this reporter pushes
its resident (and loading) model names to the controller under the multiplexed-model protocol,
which makes the router send a model's requests to the replicas that hold it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class PlacementReporter:
    """Pushes the replica's model set to Ray Serve whenever it changed (at most every interval)."""

    def __init__(self, models: Callable[[], set[str]]) -> None:
        self._models = models
        self._reported: frozenset[str] | None = None
        self._push = _controller_push()

    def requested(self, model: str) -> None:
        """A request for `model` arrived: if the router does not know it is here, say so now
        (it is loading), rather than at the next periodic report."""
        if self._reported is not None and model in self._reported:
            return
        if self._push is not None:
            self._reported = (self._reported or frozenset()) | {model}
            self._push(sorted(self._reported))

    def report(self) -> bool:
        """Push if the set differs from the last one pushed; True when a push was sent."""
        current = frozenset(self._models())
        if current == self._reported or self._push is None:
            return False
        self._push(sorted(current))
        self._reported = current
        return True


def _controller_push() -> Callable[[list[str]], None] | None:
    """The controller call Ray's own multiplex wrapper makes; None outside a replica."""
    try:
        from ray.serve._private.common import RequestRoutingInfo
        from ray.serve.context import _get_global_client, _get_internal_replica_context
    except ImportError:  # Ray moved its internals: placement degrades to load balancing
        log.warning("this Ray version has no multiplexed routing hook; placement is random")
        return None
    context = _get_internal_replica_context()  # type: ignore[no-untyped-call]
    if context is None:
        return None
    replica_id = context.replica_id

    def push(model_ids: list[str]) -> None:
        client = _get_global_client()
        if client is not None:
            client.record_request_routing_info(
                RequestRoutingInfo(replica_id=replica_id, multiplexed_model_ids=model_ids))

    return push
