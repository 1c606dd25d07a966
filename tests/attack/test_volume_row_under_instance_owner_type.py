"""K3: a volume the ledger tracks (a live ``volumes`` row recording it as its ``primary_id``) is
deleted as ``owner_deleted`` when its ref's ``provider_refs.owner_type`` is the column's default
(``instance``), as a platform that writes the C1 columns it knew before volumes (plain SQL,
``owner_type`` left to its default) leaves it.

STEP 3 (``ledger/queries.py: JOIN_SQL``) reads ``volumes`` only for ``owner_type = 'volume'``
and ``instances`` only for ``instance``/``gateway``: a ref whose owner row sits in the other
table reads as a ref whose owner row is gone (``instance_found`` false) and goes through
``classify._orphan_unless_recent(..., "owner_deleted")``, although the same statement could
see the live row naming this very volume. (The reverse, ``owner_type`` ``volume`` with a live
``instances`` row, takes the same path by reading; it is not reproduced here.)

Rule 1: "Never delete a tracked resource ... Fail closed: ... an unexpected shape ... a ledger
query error all mean skip and stay unsettled, never orphan".

Fixed: STEP 3 reads the other table's row when the one ``owner_type`` names has none
(``queries._USE_VOLUME``): the live volume owner is judged live (its statuses are no instance's:
skipped), never as a hard-deleted owner."""

from __future__ import annotations

from datetime import timedelta

import boto3
import pytest

from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.providers.aws.provider import build_aws_provider
from orphan_cleanup.queues.memory import InProcessQueue
from tests.attack.helpers import EAST, ec2, spec
from tests.support.ledger_helpers import add_backend, db_now, make_ref

pytestmark = pytest.mark.usefixtures("moto_reset")


def test_live_volume_row_keeps_its_volume_whatever_owner_type_says(moto_reset: str, emptied_db) -> None:
    db = emptied_db
    client = ec2(moto_reset)
    ref = make_ref()
    vol = client.create_volume(AvailabilityZone=f"{EAST}a", Size=8,
                               TagSpecifications=spec("volume", {"provider_ref": ref}))["VolumeId"]
    hour_ago = db_now(db) - timedelta(hours=1)
    add_backend(db, "aws-vol", regions=(EAST,), mode="delete")
    with db.transaction() as conn:  # the platform: C1 columns, owner_type left to its default
        conn.run("INSERT INTO provider_refs (provider_ref, owner_id, owner_name, issued_at)"
                 " VALUES (:r, 'vol-row-1', 'data-1', :t)", r=ref, t=hour_ago)
        conn.run("INSERT INTO volumes (id, name, provider_ref, status, backend_id, primary_id, region,"
                 " created_at, provisioned_at) VALUES ('vol-row-1', 'data-1', :r, 'active', 'aws-vol', :v, :g, :t, :t)",
                 r=ref, v=vol, g=EAST, t=hour_ago)
    pipe = Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=0, ORPHAN_CLEANUP_MAX_MODE="delete"), db=db,
                    provider_for=lambda b: build_aws_provider(b, connect_timeout=2, read_timeout=10,
                                                              session=boto3.Session()),
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue())

    report = run_cycle(pipe, "aws-vol")

    [group] = report.c3()["groups"]
    left = client.describe_volumes(Filters=[{"Name": "volume-id", "Values": [vol]}])["Volumes"]
    assert left, (f"volume {vol}, recorded by the live volumes row vol-row-1 (status active), was deleted:"
                  f" {group['verdict']} / {group['reason']} / {group['action']}")
    assert group["verdict"] != "orphan"
