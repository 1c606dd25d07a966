"""Size facts a listing reads from what the API already returned (no extra call):
informational only, they never change a verdict. ``orphans`` shows them and, with a
backend's ``prices``, estimates what an orphan costs (``core/costs.py``)."""

from __future__ import annotations

from typing import Any


def gcp_size_facts(item: Any) -> dict[str, Any]:
    """Informational size facts of a listed item (``orphans`` shows and prices them): an
    instance's ``machine_type`` (the last part of its ``machineType`` link) and ``gpus``
    (the sum of its ``guestAccelerators`` counts), a disk's ``size_gb``, an address's
    ``address``. A field missing or of another type is left out."""
    facts: dict[str, Any] = {}
    machine = getattr(item, "machine_type", None)
    if isinstance(machine, str) and machine:
        facts["machine_type"] = machine.rsplit("/", 1)[-1]
    accelerators = getattr(item, "guest_accelerators", None)
    if accelerators:
        counts = [getattr(a, "accelerator_count", 0) for a in accelerators]
        facts["gpus"] = sum(c for c in counts if isinstance(c, int))
    size = getattr(item, "size_gb", None)
    if isinstance(size, int) and size > 0:
        facts["size_gb"] = size
    address = getattr(item, "address", None)
    if isinstance(address, str) and address:
        facts["address"] = address
    return facts
