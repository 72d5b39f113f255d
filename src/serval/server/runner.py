"""Runs Serval: one serving process (built by server/build.py) until SIGTERM, then a drain;
or `workers` of them under the supervisor."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from serval.config import ServerConfig
from serval.errors import ConfigError
from serval.observability.logging import configure_logging
from serval.server.build import check_ports_free, start_server, stop_server
from serval.server.supervisor import STARTUP_FAILED, Supervisor
from serval.server.workers import resolve_workers

log = logging.getLogger(__name__)


def serve(config: ServerConfig) -> None:
    """Run the server in this process, or in `workers` processes sharing the port (the count
    chosen or checked first: server/workers.py). OSError for a port in use and ConfigError
    for a worker that cannot start, before or instead of serving."""
    configure_logging(config.log_level)
    config = resolve_workers(config)
    if config.worker_count == 1:
        run_worker(config, reuse_port=False)
        return
    check_ports_free(config)
    code = Supervisor(config.worker_count, run_worker, (config, True)).run()
    if code == STARTUP_FAILED:
        raise ConfigError("a worker could not start (the log line above says why); every "
                          "worker was stopped")
    if code:
        raise SystemExit(code)


def run_worker(config: ServerConfig, reuse_port: bool) -> None:
    """One serving process: its own event loop, registry, batchers and engines."""
    configure_logging(config.log_level)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        log.info("uvloop not installed; using the default asyncio loop")
    asyncio.run(_serve_async(config, reuse_port))


async def _serve_async(config: ServerConfig, reuse_port: bool) -> None:
    try:
        server = await start_server(config, reuse_port=reuse_port, freeze_gc=True)
    except (OSError, ConfigError) as exc:
        if not reuse_port:  # the only process: the command says why
            raise
        # a worker: restarting it would fail the same way (the supervisor stops them all)
        log.error("a worker could not start", extra={"reason": str(exc), "pid": os.getpid()})
        raise SystemExit(STARTUP_FAILED) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("serving", extra={"host": config.host, "http_port": server.http_port,
                                "grpc_port": server.grpc_port, "agent_port": server.agent_port,
                                "metrics_port": config.metrics_port or None,
                                "models": len(server.stack.registry.all_models()),
                                "pid": os.getpid()})
    await stop.wait()
    # Ctrl-C again: no more drain delay (a repeated SIGTERM, as the supervisor sends, is not)
    loop.add_signal_handler(signal.SIGINT, server.hurry.set)
    if config.drain_delay_s > 0:
        log.info("draining: not ready, serving on for the drain delay",
                 extra={"drain_delay_s": config.drain_delay_s, "pid": os.getpid()})
    log.info("shutting down: finishing in-flight requests", extra={"pid": os.getpid()})
    if not await stop_server(server, config.exit_timeout_s):
        # a model is stuck in an engine thread, which the interpreter would wait for at exit
        log.warning("exiting without waiting for the model that is still running",
                    extra={"pid": os.getpid()})
        logging.shutdown()
        os._exit(0)
