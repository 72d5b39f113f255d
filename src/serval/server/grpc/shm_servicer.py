"""Triton's shared-memory RPCs (SystemSharedMemory*, and CudaSharedMemory*, which this server
refuses: it has no CUDA), mixed into the InferenceServicer."""

from __future__ import annotations

from typing import Any

from serval.auth import Action, current_token
from serval.dataplane import DataPlane
from serval.errors import InvalidInput, ServalError
from serval.protocol.grpc import grpc_service_pb2 as pb
from serval.protocol.grpc.status import GrpcStatus
from serval.protocol.shared_memory import SharedMemoryRegistry
from serval.protocol.shm_tensors import CUDA_UNSUPPORTED, DISABLED
from serval.server.grpc.errors import grpc_error

Context = Any  # serval.server.grpc.calls.CallContext


class SharedMemoryRpcs:
    """System shared-memory status / register / unregister over the data plane's regions."""

    dataplane: DataPlane

    async def _authorize(self, context: Context, action: Action, model: str = "") -> None:
        raise NotImplementedError  # the servicer's

    async def SystemSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        regions = await self._regions(context)
        response = pb.SystemSharedMemoryStatusResponse()
        try:
            for status in regions.status(request.name, current_token()):
                response.regions[status.name].CopyFrom(
                    pb.SystemSharedMemoryStatusResponse.RegionStatus(**status.as_dict()))
        except ServalError as exc:
            await context.abort(*grpc_error(exc, "SystemSharedMemoryStatus"))
        return response

    async def SystemSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        regions = await self._regions(context)
        try:
            regions.register(request.name, request.key, request.offset, request.byte_size,
                             current_token())
        except ServalError as exc:
            await context.abort(*grpc_error(exc, "SystemSharedMemoryRegister"))
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        regions = await self._regions(context)
        regions.unregister(request.name, current_token())  # empty: every region it reaches
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        """Empty: no CUDA region is ever registered; asking for one by name is refused."""
        await self._authorize(context, Action.SHARED_MEMORY)
        if request.name:
            await context.abort(GrpcStatus.UNIMPLEMENTED, CUDA_UNSUPPORTED)
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        await self._authorize(context, Action.SHARED_MEMORY)
        await context.abort(GrpcStatus.UNIMPLEMENTED, CUDA_UNSUPPORTED)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        """Nothing to do (Triton's clients call it before they start), as for a system region
        that is not registered."""
        await self._authorize(context, Action.SHARED_MEMORY)
        return pb.CudaSharedMemoryUnregisterResponse()

    async def _regions(self, context: Context) -> SharedMemoryRegistry:
        await self._authorize(context, Action.SHARED_MEMORY)
        regions = self.dataplane.shared_memory
        if regions is None:
            await context.abort(*grpc_error(InvalidInput(DISABLED), "SystemSharedMemory"))
        assert regions is not None
        return regions
