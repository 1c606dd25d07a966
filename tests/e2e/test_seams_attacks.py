"""Attacks on docs/SAFETY.md rules 12, 14, 15, 17 and 18, reproduced on real parts (a real Postgres
ledger, EC2 on the moto server, the real AWS adapter) by a review of the seams change, and
closed since: each test asserts the safe outcome.

- a forged listing batch (anyone who may write to the listing queue knows a live cycle's id,
  its listing time and a free seq: every real batch and log line carries them) that hangs a
  live owner's detached volume under a made-up retry leak: nothing of it is deleted, in that
  cycle or, through ``orphan_resources``, in a later honest one;
- a remembered termination protection, with a deleter role that cannot read the attribute:
  probed by one refused terminate, never again;
- a rewritten cycle snapshot (a protect key removed): the deleter also applies the account's
  keys as they are now."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.providers.aws.provider import build_aws_provider
from orphan_cleanup.queues.memory import InProcessQueue
from tests.integration.test_aws_provider import EAST, create_volume, ec2, exists, run_instance
from tests.support.ledger_helpers import add_backend, add_instance, db_now, make_ref

pytestmark = pytest.mark.usefixtures("moto_reset")
OLD = timedelta(days=1)


class ForgingQueue(InProcessQueue):
    """The listing queue, where someone who may SendMessage replaces the cycle's first batch
    with one of their own (same cycle id, seq, listed_at: all in any real batch or log line)."""

    def __init__(self, extra_groups: list[ResourceGroup]) -> None:
        super().__init__()
        self.extra = extra_groups

    def publish(self, message: Any) -> None:
        if isinstance(message, ListingBatch) and message.seq == 0 and self.extra:
            message = message.model_copy(update={"groups": (*message.groups, *self.extra)})
            self.extra = []
        super().publish(message)


def pipe(db, session, queue: InProcessQueue) -> Pipeline:
    return Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=0,
                                       ORPHAN_CLEANUP_MAX_MODE="delete"), db=db,
                    provider_for=lambda b: build_aws_provider(b, connect_timeout=2, read_timeout=10, session=session),
                    listing_queue=queue, delete_queue=InProcessQueue())


def forged_leak_group(ref: str, fake_vm: str, victim_volume: str, t) -> ResourceGroup:
    """A 'retry leak' that never existed: a made-up (well-formed, unknown) instance id with the
    live owner's real, detached data volume hung under it."""
    return ResourceGroup(provider_ref=ref, region=EAST, primary_id=fake_vm, resources=(
        Resource(kind=ResourceKind.INSTANCE, id=fake_vm, region=EAST, tags={"provider_ref": ref}, created_at=t),
        Resource(kind=ResourceKind.VOLUME, id=victim_volume, region=EAST, state=ResourceState.AVAILABLE,
                 tags={"provider_ref": ref}, created_at=t, attached_to=fake_vm),
    ))


def live_owner(db, client) -> tuple[str, str, str]:
    ref = make_ref()
    vm = run_instance(client, ref)["InstanceId"]  # the owner's recorded, live primary
    spare = create_volume(client, ref)  # the owner's detached data volume (kept aside, in use later)
    t = db_now(db) - OLD
    add_instance(db, ref=ref, status="busy", backend_id="aws-a", primary_id=vm, region=EAST,
                 issued_at=t, created_at=t, provisioned_at=t)
    return ref, vm, spare


def test_forged_batch_deletes_a_live_owners_detached_volume_in_the_same_cycle(emptied_db, session):
    db, client = emptied_db, ec2(EAST)
    add_backend(db, "aws-a", regions=(EAST,), mode="delete")
    ref, vm, spare = live_owner(db, client)
    forged = forged_leak_group(ref, "i-0123456789abcdef0", spare, db_now(db) - 2 * OLD)

    run_cycle(pipe(db, session, ForgingQueue([forged])), "aws-a")

    # the made-up primary is gone at the deleter's first re-read: its group is left alone
    assert exists(client, "instance", vm) and exists(client, "volume", spare)
    with db.connection() as conn:
        assert conn.run("SELECT count(*) FROM provider_journal") == [[0]]


def test_forged_report_batch_poisons_orphan_resources_and_a_later_honest_delete_cycle_deletes(emptied_db, session):
    db, client = emptied_db, ec2(EAST)
    add_backend(db, "aws-a", regions=(EAST,), mode="report")
    ref, vm, spare = live_owner(db, client)
    forged = forged_leak_group(ref, "i-0123456789abcdef0", spare, db_now(db) - 2 * OLD)

    # a report cycle only: nothing is deleted, but the forged verdict is remembered (append-only)
    run_cycle(pipe(db, session, ForgingQueue([forged])), "aws-a")
    assert exists(client, "volume", spare)
    with db.connection() as conn:
        # a listing never names an orphan VM's resources for later cycles: only the deleter's re-read does
        assert conn.run("SELECT count(*) FROM orphan_resources") == [[0]]
        conn.run("UPDATE backends SET mode = 'delete' WHERE id = 'aws-a'")

    # later an honest delete cycle (no forged message at all) lists the spare volume where it is
    report = run_cycle(pipe(db, session, InProcessQueue()), "aws-a")
    [spare_group] = [g for g in report.c3()["groups"] if g["primary_id"] is None]
    assert (spare_group["verdict"], spare_group["reason"]) == ("protected", "unattached_of_live_owner")
    assert exists(client, "instance", vm) and exists(client, "volume", spare)


class NoDescribeAttribute:
    """An EC2 client whose role lacks ec2:DescribeInstanceAttribute (a custom deleter role)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def describe_instance_attribute(self, **kw: Any) -> Any:
        raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "denied"}},
                          "DescribeInstanceAttribute")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_remembered_termination_protection_is_probed_with_terminate_every_delete_cycle(emptied_db, session):
    db, client = emptied_db, ec2(EAST)
    add_backend(db, "aws-a", regions=(EAST,), mode="delete")
    ref = make_ref()
    vm = run_instance(client, ref)["InstanceId"]
    client.modify_instance_attribute(InstanceId=vm, DisableApiTermination={"Value": True})
    t = db_now(db) - OLD
    add_instance(db, ref=ref, status="terminated", backend_id="aws-a", primary_id=vm, region=EAST,
                 issued_at=t, created_at=t, provisioned_at=t, terminated_at=t)

    def provider_for(b):
        p = build_aws_provider(b, connect_timeout=2, read_timeout=10, session=session)
        real = p.ec2
        p.ec2 = lambda region: NoDescribeAttribute(real(region))  # type: ignore[method-assign]
        return p

    def cycle() -> Any:
        return run_cycle(Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=0,
                                       ORPHAN_CLEANUP_MAX_MODE="delete"), db=db,
                                  provider_for=provider_for, listing_queue=InProcessQueue(),
                                  delete_queue=InProcessQueue()), "aws-a")

    for _ in range(3):
        cycle()
        with db.connection() as conn:  # remembered across delete cycles
            assert conn.run("SELECT state, reason FROM orphans") == [["protected", "termination_protection"]]
    with db.connection() as conn:
        terminates = conn.run("SELECT outcome FROM provider_journal WHERE call = 'ec2:TerminateInstances'"
                              " AND phase = 'result'")
    assert exists(client, "instance", vm)
    assert terminates == [["refused"]], f"{terminates}: TerminateInstances on a remembered protection"


# ---- rule 18: a snapshot rewritten by whoever could write it (roles.sql denies it to the runtime) ------

@pytest.mark.parametrize("rewrite_snapshot", [False, True])
def test_a_rewritten_cycle_snapshot_disarms_the_deleters_protect_reread(emptied_db, session, rewrite_snapshot):
    from tests.support.ledger_helpers import add_ref
    db, client = emptied_db, ec2(EAST)
    add_backend(db, "aws-a", regions=(EAST,), mode="delete")
    ref = add_ref(db, issued_at=db_now(db) - OLD)  # owner row hard-deleted: an honest orphan
    vol = create_volume(client, ref)

    def confirm(plan: Any) -> bool:
        # between classification and the delete: the operator protects the volume at the last minute
        client.create_tags(Resources=[vol], Tags=[{"Key": "orphan-cleanup-protect", "Value": "keep"}])
        if rewrite_snapshot:  # ... and a holder of UPDATE on cycles (the runtime role) rewrites the snapshot
            with db.connection() as conn:
                conn.run("UPDATE cycles SET backend_snapshot = jsonb_set(backend_snapshot,"
                         " '{settings,protect_tag_key}', '\"not-a-key-anyone-uses\"')")
        return True

    run_cycle(pipe(db, session, InProcessQueue()), "aws-a", confirm=confirm)
    assert exists(client, "volume", vol)  # the account's protect key as it is now applies too
