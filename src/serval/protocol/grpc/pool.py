"""Serval's own protobuf descriptor pool. The v2 service and Triton's model config are built
here, not in protobuf's default pool, because tritonclient registers the same `inference.*`
symbols there: a process that imports both (a test run, an application embedding Serval next
to a Triton client) would otherwise fail with "duplicate symbol". `make proto` points the
generated modules at this pool."""

from __future__ import annotations

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
