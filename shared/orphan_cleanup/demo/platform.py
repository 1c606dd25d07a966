"""The demo's platform: it provisions VMs through the ledger client, the way a
real platform should, and leaks them in each way real platforms do.

Every VM is a real ``run_instances`` call (on moto) tagged with its ref. The
ledger rows that stand for events an hour ago are backdated (``LedgerStore.backdate_owner``),
as if the platform had written them then; moto stamps every VM with
the wall-clock launch time, which is why the demo waits out its short margin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY, DEFAULT_TAG_KEY
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.client import LedgerClient, aws_tag_specifications, new_ref
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore

AMI = "ami-12c6146b"  # one of moto's built-in images
AN_HOUR = 3600


@dataclass
class Scenario:
    """One VM of the demo fleet and what the cleanup must conclude about it."""

    key: str  # a stable name (the e2e test reads it)
    story: str  # what happened to it, in the platform's words
    verdict: str
    reason: str
    instance_id: str = ""
    provider_ref: str = ""
    # (verdict, reason) once the margin has passed, when it differs.
    later: tuple[str, str] | None = None

    @property
    def is_orphan(self) -> bool:
        return self.verdict == "orphan"

    def expected_action(self, mode: str, *, marked: bool = False) -> str:
        """Its action in a cycle of ``mode``; ``marked``: a delete cycle finds it an orphan
        for the first time, and marks it (SAFETY.md rule 23)."""
        if self.verdict == "protected":
            return "reported"
        if self.verdict == "orphan":
            return "reported" if mode == "report" else "marked" if marked else "deleted"
        return "none"


class DemoPlatform:
    """A tiny scheduler: ``issue_ref`` → ``run_instances`` → ``mark_provisioning``."""

    def __init__(self, db: Database, ec2: Any, backend_id: str, region: str) -> None:
        self.db = db
        self.ec2 = ec2
        self.backend_id = backend_id
        self.region = region
        self.ledger = LedgerClient(db)
        self.store = LedgerStore(db)

    # -- the platform's primitives ---------------------------------------------------

    def launch(self, ref: str, **extra_tags: str) -> str:
        """One ``run_instances`` call, tagged with the ref (instance, volume, interface)."""
        specs = aws_tag_specifications(ref)
        for spec in specs:
            spec["Tags"] += [{"Key": k, "Value": v} for k, v in extra_tags.items()]
        reply = self.ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="t3.micro",
                                       TagSpecifications=specs)
        return reply["Instances"][0]["InstanceId"]

    def provisioned(self, owner_id: str, instance_id: str, status: OwnerStatus = OwnerStatus.BUSY) -> None:
        self.ledger.mark_provisioning(owner_id, backend_id=self.backend_id, primary_id=instance_id,
                                      region=self.region, status=status)

    def backdate(self, owner_id: str, seconds: int = AN_HOUR, *, provisioned_only: bool = False) -> None:
        """Move an owner's recorded events ``seconds`` into the past (through the store)."""
        self.store.backdate_owner(owner_id, seconds, provisioned_only=provisioned_only)

    # -- the fleet ----------------------------------------------------------------------

    def play_history(self) -> list[Scenario]:
        """Everything that happened more than the margin before the listing."""
        fleet: list[Scenario] = []

        # A job running for an hour: the only kind of VM the platform should have.
        owner = self.ledger.issue_ref(owner_name="train-llama")
        vm = self.launch(owner.provider_ref)
        self.provisioned(owner.owner_id, vm)
        self.backdate(owner.owner_id)
        fleet.append(Scenario("tracked", "a running job the ledger tracks", "tracked", "tracked", vm,
                              owner.provider_ref))

        # Someone used "Launch more like this" on it: the copy carries the same ref
        # tag and was launched long after the owner was provisioned.
        copy = self.launch(owner.provider_ref)
        fleet.append(Scenario("copy", '"launch more like this" of the tracked job\'s VM (same ref tag)',
                              "protected", "suspected_copy", copy, owner.provider_ref))

        # run_instances timed out; the retry (same ref) succeeded and was recorded.
        # Real timestamps here: the lost VM predates the recorded provisioning.
        retried = self.ledger.issue_ref(owner_name="eval-run")
        lost = self.launch(retried.provider_ref)
        kept = self.launch(retried.provider_ref)
        self.provisioned(retried.owner_id, kept)
        fleet.append(Scenario("retry-lost", "a retry's first VM: the call timed out, the VM came up anyway",
                              "orphan", "primary_mismatch", lost, retried.provider_ref))
        fleet.append(Scenario("retry-kept", "the retry's second VM, recorded in the ledger", "tracked", "tracked",
                              kept, retried.provider_ref))

        # The server crashed between run_instances and the commit of the provisioning
        # data; on restart it deleted the stale placeholder. Its ref stays behind.
        crashed = self.ledger.issue_ref(owner_name="notebook-ana")
        vm = self.launch(crashed.provider_ref)
        self.backdate(crashed.owner_id)
        self.ledger.hard_delete(crashed.owner_id)
        fleet.append(Scenario("crash", "server crashed between create and commit; placeholder deleted",
                              "orphan", "owner_deleted", vm, crashed.provider_ref))

        # The server crashed after run_instances returned, before it recorded the provisioning
        # data, and nothing reaped the placeholder: its owner stays pending, and every cycle
        # skips the VM, until the platform reaps the row (README, "Stale pending owners").
        stuck = self.ledger.issue_ref(owner_name="batch-9")
        vm = self.launch(stuck.provider_ref)
        self.backdate(stuck.owner_id, 2 * AN_HOUR)
        fleet.append(Scenario("stuck-pending", "crashed after create, before recording it; the row stays pending",
                              "skipped", "owner_pending", vm, stuck.provider_ref, later=("orphan", "owner_terminated")))

        # The provider raised after creating the VM; the placeholder was hard-deleted.
        failed = self.ledger.issue_ref(owner_name="job-7-placeholder")
        vm = self.launch(failed.provider_ref)
        self.backdate(failed.owner_id)
        self.ledger.hard_delete(failed.owner_id)
        fleet.append(Scenario("failed-placeholder", "provider errored after creating it; placeholder deleted",
                              "orphan", "owner_deleted", vm, failed.provider_ref))

        # Termination gave up after retrying: the ledger says terminated, the VM runs.
        fleet.append(self._gave_up("gave-up", "termination gave up; the VM kept running",
                                   "orphan", "owner_terminated"))
        fleet.append(self._gave_up("protected", "termination gave up too, but someone tagged it "
                                   f"{DEFAULT_PROTECT_KEY}", "protected", "protect_tag", protect=True))

        # Another platform's VM in the same account: same tag key, a ref we never issued.
        foreign = new_ref()
        fleet.append(Scenario("foreign", "another platform's VM (its ref is not in this ledger)", "ignored",
                              "no_record", self.launch(foreign), foreign))
        return fleet

    def _gave_up(self, key: str, story: str, verdict: str, reason: str, *, protect: bool = False) -> Scenario:
        owner = self.ledger.issue_ref(owner_name=f"{key}-job")
        vm = self.launch(owner.provider_ref)
        self.provisioned(owner.owner_id, vm, OwnerStatus.IDLE)
        self.ledger.mark_terminated(owner.owner_id)
        self.backdate(owner.owner_id)
        if protect:
            self.ec2.create_tags(Resources=[vm], Tags=[{"Key": DEFAULT_PROTECT_KEY, "Value": "keep for debugging"}])
        return Scenario(key, story, verdict, reason, vm, owner.provider_ref)

    def play_just_now(self) -> Scenario:
        """A placeholder that failed a moment ago, inside the margin of the listing."""
        owner = self.ledger.issue_ref(owner_name="job-8-placeholder")
        vm = self.launch(owner.provider_ref)
        self.ledger.hard_delete(owner.owner_id)
        return Scenario("just-failed", "a placeholder that failed seconds ago (inside the margin)", "skipped",
                        "recent_owner_change", vm, owner.provider_ref, later=("orphan", "owner_deleted"))


    def reap_stale_pending(self, older_than_seconds: int = AN_HOUR) -> list[str]:
        """What the README asks of a platform: give up on owners pending for longer than any
        create call takes (marked terminated; cleanup deletes what they left)."""
        return [p.owner_id for p in self.ledger.stale_pending(older_than_seconds)
                if self.ledger.reap_pending(p.owner_id, p.owner_type)]


def running_instances(ec2: Any) -> dict[str, str]:
    """instance id -> ref of every instance not terminated, as moto reports them."""
    found: dict[str, str] = {}
    for page in ec2.get_paginator("describe_instances").paginate():
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                if inst["State"]["Name"] in ("terminated", "shutting-down"):
                    continue
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                found[inst["InstanceId"]] = tags.get(DEFAULT_TAG_KEY, "-")
    return found
