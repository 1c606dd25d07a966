"""The two clouds of the provider contract suite, each behind the same small driver.

A scenario (``test_provider_contract.py``) names things by their *role* (``vm``,
``vm.boot``, ``vm.data``, ``live``...), never by a cloud's id; a driver makes the thing
on its cloud, remembers which id and name play which role, and reads back what exists.
Everything the product touches is real: ``AwsProvider`` over HTTP against the moto
server (through a recording proxy, ``tests/support/aws_proxy.py``) and ``GcpProvider``
with the real google-cloud-compute client against the fake Compute REST server
(``tests/support/gcp_fake*.py``), built by the composition root (``bootstrap``).

The one place where the two clouds' call names meet is ``ACTIONS`` (the journal's
``call`` column -> a cloud-neutral action) with its wire side (``AwsDriver.wire_call``,
``GcpDriver.wire_call``: a request the cloud saw -> the journal's call name).
"""

from __future__ import annotations

import functools
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock
from urllib.parse import parse_qs

import boto3
import moto.ec2.models.elastic_block_store as moto_ebs
import moto.ec2.models.instances as moto_instances
from moto.core.utils import utcnow as moto_utcnow

from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY, DEFAULT_TAG_KEY, Backend
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline, ProviderFactory
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.providers.aws.calls import MUTATING
from orphan_cleanup.providers.aws.provider import build_aws_provider
from orphan_cleanup.providers.base import ResourceProvider
from orphan_cleanup.providers.ratelimit import process_limits, settings_budgets
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.aws_proxy import THROTTLED_BODY, AwsProxy, Rule
from tests.support.gcp_fake import FakeCompute
from tests.support.gcp_fake_wire import project_number
from tests.support.ledger_helpers import add_backend

BACKEND = "contract"
PROTECT = {DEFAULT_PROTECT_KEY: "yes"}

#: The journal's ``call`` (SAFETY.md rule 19) -> the action it is, whichever cloud made it.
ACTIONS: Mapping[str, str] = {
    "ec2:TerminateInstances": "delete-instance",
    "compute.instances.delete": "delete-instance",
    "ec2:DeleteVolume": "delete-disk",
    "compute.disks.delete": "delete-disk",
    "ec2:ReleaseAddress": "delete-address",
    "compute.addresses.delete": "delete-address",
    "ec2:DisassociateAddress": "disassociate-address",
    "ec2:CreateSnapshot": "snapshot-disk",
    "compute.disks.createSnapshot": "snapshot-disk",
    "ec2:DeleteSnapshot": "delete-snapshot",
    "compute.snapshots.delete": "delete-snapshot",
    "ec2:CancelSpotInstanceRequests": "cancel-spot-request",
    "ec2:DetachNetworkInterface": "detach-interface",
    "ec2:DeleteNetworkInterface": "delete-interface",
    "ec2:DeleteSecurityGroup": "delete-security-group",
    "ec2:DeleteLaunchTemplate": "delete-launch-template",
    "ec2:DeleteKeyPair": "delete-key-pair",
    "ec2:DeletePlacementGroup": "delete-placement-group",
    "elasticloadbalancing:DeleteLoadBalancer": "delete-load-balancer",
    "elasticloadbalancing:DeleteTargetGroup": "delete-target-group",
}
assert set(MUTATING.values()) <= set(ACTIONS), "a mutating EC2 call the suite cannot name"


def settings(margin_seconds: int = 0, **values: Any) -> Settings:
    """The settings of every contract cycle: margin 0 unless a row says otherwise (the clouds
    stamp creation times now, the ledger is backdated), short read timeouts (a call throttled
    past its retries gives up in seconds), budgets high enough that no test waits for a token."""
    fast = {f"{c}_{k}": 200.0 for c in ("describe", "mutate", "terminate") for k in ("rate", "burst")}
    # window 0 (docs/SAFETY.md rule 23): a contract cycle in delete mode deletes in its first cycle
    return Settings.explicit(margin_seconds=margin_seconds, provider_read_timeout=3.0, provider_connect_timeout=3.0,
                             **fast, **{"confirm_seconds": 0, **values})


@dataclass(frozen=True)
class Thing:
    """One resource a scenario made: its role, kind, the cloud's id (and GCP name), where."""

    role: str
    kind: str  # instance | disk | spot-request
    id: str
    region: str
    name: str = ""
    location: str = ""  # GCP: the zone


class Driver(ABC):
    """The primitives a scenario is written in. ``regions`` are the backend's two
    regions (the first is where things go unless told); roles are unique per test."""

    cloud: str
    regions: tuple[str, str]
    #: What the failure of a region all of whose calls are refused for their rate says (``throttle``).
    region_throttled: str

    def __init__(self, db: Database) -> None:
        self.db = db
        self.things: dict[str, Thing] = {}
        #: The cycle's margin (STEP 5, rule 2): 0 unless a row sets it before its cycle.
        self.margin_seconds = 0

    # --- the backend and the pipeline -------------------------------------------------

    @abstractmethod
    def settings(self) -> Settings: ...

    @property
    @abstractmethod
    def account(self) -> str: ...

    def add_backend(self) -> str:
        return add_backend(self.db, BACKEND, provider=self.cloud, account=self.account, regions=self.regions,
                           mode="delete")

    def pipeline(self, listing_queue: InProcessQueue | None = None) -> Pipeline:
        """The CLI's pipeline (``bootstrap.build_pipeline``: the real provider factory and
        adapters), with in-process queues, on this test's database; ``listing_queue``: the
        listing queue to use instead of a plain one (one that forges what it carries)."""
        return bootstrap.build_pipeline(self.settings(), db=self.db,
                                        listing_queue=listing_queue if listing_queue is not None else InProcessQueue(),
                                        delete_queue=InProcessQueue(), provider_for=self.provider_for())

    def provider_for(self) -> ProviderFactory | None:
        """The adapters' factory; None: the composition root's (``bootstrap.provider_factory``)."""
        return None

    # --- making things ---------------------------------------------------------------------

    @abstractmethod
    def vm(self, role: str, ref: str, *, region: str | None = None, launched_ago: timedelta | None = None) -> str:
        """An instance carrying ``ref`` with its boot disk / root volume (role ``ROLE.boot``),
        carrying ``ref`` too and deleted with the instance (autoDelete / DeleteOnTermination),
        as the platform creates them; ``launched_ago``: both made that long ago, as the cloud
        dates them (default: now). Returns the instance's id."""

    @abstractmethod
    def disk(self, role: str, *, attach_to: str, labels: Mapping[str, str], auto_delete: bool) -> str:
        """A data disk / volume with these labels / tags, attached to the instance of role
        ``attach_to`` (in its zone), deleted with it or not. Returns its id."""

    @abstractmethod
    def volume(self, role: str, *, near: str, labels: Mapping[str, str], created_ago: timedelta | None = None) -> str:
        """A volume / disk on its own (a volume owner's: README, C1), detached, in the zone of
        the instance of role ``near``, with these labels / tags, made ``created_ago`` ago as the
        cloud dates it (default: now). Returns its id."""

    @abstractmethod
    def attach(self, role: str, *, to: str) -> None:
        """Someone attaches the volume / disk ``role`` to the instance ``to`` (same zone), not
        deleted with it."""

    def spot_vm(self, role: str, ref: str) -> str:
        """An instance carrying ``ref`` launched by a persistent spot request that carries no
        ref (role ``ROLE.request``). Only a cloud with spot requests has one."""
        raise NotImplementedError(f"{self.cloud} has no spot requests")

    @abstractmethod
    def mangled(self, instance_id: str) -> str:
        """What a platform that mangles ids would record for this instance id: no instance's id."""

    # --- what a forged listing names (``forgery.py``) -----------------------------------------

    #: The details key of a resource's zone (GCP lists ``zone``, EC2 ``AvailabilityZone``).
    zone_key: str
    #: Another zone of the backend's first region than the one where things go.
    other_zone: str
    #: The details key of a disk's / volume's size (GCP ``size_gb``, EC2 ``Size``).
    size_key: str
    #: The details key of the provider's own word for a state (GCP ``status``, EC2 ``state``).
    raw_state_key: str

    @abstractmethod
    def link(self, role: str) -> str:
        """A link naming the thing: its GCP self link; on AWS (which lists none) its ARN."""

    def name(self, role: str) -> str:
        """The thing's name: its GCP name; on AWS (no names) its id."""
        thing = self.things[role]
        return thing.name or thing.id

    @abstractmethod
    def device(self, role: str) -> str:
        """The device name a disk / volume is attached at, as its instance shows it."""

    # --- changing them behind the product's back ---------------------------------------------

    @abstractmethod
    def label(self, role: str, **changes: str | None) -> None:
        """Set (a value) or remove (None) labels / tags of a thing."""

    @abstractmethod
    def vanish(self, role: str) -> None:
        """A disk / volume detached and deleted out of band."""

    @abstractmethod
    def manage(self, role: str) -> None:
        """The instance becomes one a controller would re-create (an EKS node group's tag, a
        managed instance group's ``created-by``), as the listing and the deleter read it."""

    @abstractmethod
    def swap_boot(self, role: str, new_role: str) -> str:
        """Someone stops the instance ``role``, detaches its boot disk / root volume (it stays,
        with its labels) and attaches an unlabelled disk / volume of their own, made now (role
        ``new_role``), at its boot / root device, deleted with the instance. Returns its id."""

    @abstractmethod
    def throttle(self, region: str) -> None:
        """Every call of the product in ``region`` is refused for its rate from now on."""

    @abstractmethod
    def throttle_listing(self) -> None:
        """Every listing call of the product, in every region, is refused for its rate from
        now on (the identity check is not)."""

    # --- reading back ------------------------------------------------------------------------------

    @abstractmethod
    def exists(self, role: str) -> bool:
        """Whether the thing is still there (an instance: not shutting down or terminated;
        a spot request: not cancelled or closed)."""

    def survivors(self) -> set[str]:
        return {role for role in self.things if self.exists(role)}

    @abstractmethod
    def wire_mutations(self) -> list[tuple[str, str]]:
        """Every mutating request the cloud received from the product, in order:
        ``(journal call name, target id or name)``."""

    def role_of(self, key: str) -> str:
        """The role of an id or GCP name (the id itself for a thing no scenario made)."""
        for thing in self.things.values():
            if key in (thing.id, thing.name):
                return thing.role
        return key

    def _keep(self, thing: Thing) -> str:
        if thing.role in self.things:
            raise ValueError(f"role {thing.role} made twice")
        self.things[thing.role] = thing
        return thing.id


# --- AWS ---------------------------------------------------------------------------------------------

AMI = "ami-12c6146b"
RETRIES_WHEN_THROTTLED = 1
GONE_STATES = ("shutting-down", "terminated")
_WIRE_TARGET = {  # the request parameter naming the target, per mutating EC2 action (query protocol)
    "TerminateInstances": "InstanceId.1", "DeleteVolume": "VolumeId", "CreateSnapshot": "VolumeId",
    "DeleteSnapshot": "SnapshotId", "CancelSpotInstanceRequests": "SpotInstanceRequestId.1",
    "ReleaseAddress": "AllocationId", "DisassociateAddress": "AssociationId",
    "DetachNetworkInterface": "AttachmentId", "DeleteNetworkInterface": "NetworkInterfaceId",
    "DeleteSecurityGroup": "GroupId",
}


@contextmanager
def moto_clock_behind(by: timedelta) -> Iterator[None]:
    """While the block runs, moto's EC2 (in this process) stamps launch, create and attach
    times ``by`` earlier: ``utcnow`` as ``moto.ec2.models.instances`` and
    ``moto.ec2.models.elastic_block_store`` imported it, where those stamps are taken. The
    times are then moto's own, the same in every reply."""
    def earlier() -> datetime:
        return moto_utcnow() - by

    with mock.patch.object(moto_instances, "utcnow", earlier), mock.patch.object(moto_ebs, "utcnow", earlier):
        yield


@functools.cache
def _test_client(moto_url: str, region: str) -> Any:
    """The test's own EC2 client of a region (kept for the session: a client costs a model load)."""
    return boto3.client("ec2", region_name=region, endpoint_url=moto_url)


class RecordingProxy(AwsProxy):
    """``AwsProxy`` that also keeps the parameters of each mutating request it saw
    (refused ones included: the cloud saw them)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.mutations: list[tuple[str, dict[str, str]]] = []

    def rule_for(self, action: str, body: bytes) -> Rule | None:
        if f"ec2:{action}" in MUTATING.values():
            params = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
            with self._lock:
                self.mutations.append((action, params))
        return super().rule_for(action, body)


class AwsDriver(Driver):
    cloud = "aws"
    regions = ("us-east-1", "eu-west-1")
    region_throttled = "ProviderThrottled"
    zone_key, other_zone, size_key, raw_state_key = "AvailabilityZone", "us-east-1b", "Size", "state"

    def __init__(self, db: Database, moto_url: str, proxy: RecordingProxy) -> None:
        super().__init__(db)
        self.proxy = proxy
        # The test's own calls go straight to moto: the proxy sees only the product's.
        self._ec2 = {r: _test_client(moto_url, r) for r in self.regions}
        self._devices = iter(f"/dev/sd{c}" for c in "fghijklmnop")
        self._spot: dict[str, str] = {}  # instance id -> its spot request id
        self._throttled = False

    @property
    def account(self) -> str:
        return "123456789012"

    def settings(self) -> Settings:
        return settings(self.margin_seconds, aws_endpoint_url=self.proxy.url)

    def provider_for(self) -> ProviderFactory | None:
        """The composition root's, except once a row throttles: then the same adapter
        (``build_aws_provider`` with what ``bootstrap.provider_factory`` passes it) with one
        botocore retry instead of five, so that "throttled past its retries" takes a second
        of backoff rather than up to half a minute. Nothing else changes."""
        if not self._throttled:
            return None
        s = self.settings()
        limits = process_limits(settings_budgets(s))

        def build(backend: Backend) -> ResourceProvider:
            return build_aws_provider(backend, connect_timeout=s.provider_connect_timeout,
                                      read_timeout=s.provider_read_timeout, endpoint_url=s.aws_endpoint_url,
                                      limits=limits, max_attempts=RETRIES_WHEN_THROTTLED)

        return build

    def ec2(self, role_or_region: str) -> Any:
        thing = self.things.get(role_or_region)
        return self._ec2[thing.region if thing else role_or_region]

    def vm(self, role: str, ref: str, *, region: str | None = None, launched_ago: timedelta | None = None) -> str:
        # The instance and its root volume carry the ref; its primary interface does not: moto
        # attaches it with DeleteOnTermination false and keeps it after the instance (EC2 deletes
        # it with the instance), so a ref-tagged one would be an AWS-only member that the deleter
        # detaches and deletes in a pass of its own. GCP has no interface resource to compare.
        region = region or self.regions[0]
        tags = [{"Key": DEFAULT_TAG_KEY, "Value": ref}]
        with moto_clock_behind(launched_ago or timedelta(0)):
            [inst] = self._ec2[region].run_instances(
                ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="t3.micro",
                TagSpecifications=[{"ResourceType": t, "Tags": tags} for t in ("instance", "volume")])["Instances"]
        return self._launched(role, inst, region)

    def _launched(self, role: str, inst: Mapping[str, Any], region: str) -> str:
        [root] = inst["BlockDeviceMappings"]
        assert root["Ebs"]["DeleteOnTermination"] is True, root
        self._keep(Thing(f"{role}.boot", "disk", root["Ebs"]["VolumeId"], region))
        return self._keep(Thing(role, "instance", inst["InstanceId"], region))

    def disk(self, role: str, *, attach_to: str, labels: Mapping[str, str], auto_delete: bool) -> str:
        owner = self.things[attach_to]
        ec2 = self.ec2(attach_to)
        az = ec2.describe_instances(InstanceIds=[owner.id])["Reservations"][0]["Instances"][0]["Placement"][
            "AvailabilityZone"]
        spec = [{"ResourceType": "volume", "Tags": [{"Key": k, "Value": v} for k, v in labels.items()]}]
        vol = ec2.create_volume(AvailabilityZone=az, Size=1, **({"TagSpecifications": spec} if labels else {}))
        device = next(self._devices)
        ec2.attach_volume(VolumeId=vol["VolumeId"], InstanceId=owner.id, Device=device)
        if auto_delete:  # EC2 attaches a volume with DeleteOnTermination false unless asked
            ec2.modify_instance_attribute(InstanceId=owner.id, BlockDeviceMappings=[
                {"DeviceName": device, "Ebs": {"DeleteOnTermination": True}}])
        return self._keep(Thing(role, "disk", vol["VolumeId"], owner.region))

    def volume(self, role: str, *, near: str, labels: Mapping[str, str], created_ago: timedelta | None = None) -> str:
        owner = self.things[near]
        az = self._instance(near)["Placement"]["AvailabilityZone"]
        spec = [{"ResourceType": "volume", "Tags": [{"Key": k, "Value": v} for k, v in labels.items()]}]
        with moto_clock_behind(created_ago or timedelta(0)):
            vol = self.ec2(near).create_volume(AvailabilityZone=az, Size=1, TagSpecifications=spec)
        return self._keep(Thing(role, "disk", vol["VolumeId"], owner.region))

    def attach(self, role: str, *, to: str) -> None:
        self.ec2(to).attach_volume(VolumeId=self.things[role].id, InstanceId=self.things[to].id,
                                   Device=next(self._devices))

    def spot_vm(self, role: str, ref: str) -> str:
        region = self.regions[0]
        ec2 = self._ec2[region]
        [request] = ec2.request_spot_instances(
            SpotPrice="0.5", InstanceCount=1, Type="persistent",
            LaunchSpecification={"ImageId": AMI, "InstanceType": "t3.micro"})["SpotInstanceRequests"]
        sir, iid = request["SpotInstanceRequestId"], request["InstanceId"]
        [inst] = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"]
        root = inst["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
        ec2.create_tags(Resources=[iid, root], Tags=[{"Key": DEFAULT_TAG_KEY, "Value": ref}])
        self._keep(Thing(f"{role}.request", "spot-request", sir, region))
        self._spot[iid] = sir
        if len(self._spot) == 1:  # EC2 names an instance's spot request in DescribeInstances; moto leaves it out
            self.proxy.add_rule(Rule("DescribeInstances", rewrite=self._name_spot_requests))
        return self._launched(role, inst, region)

    def _name_spot_requests(self, body: bytes) -> bytes:
        for iid, sir in self._spot.items():
            body = body.replace(f"<instanceId>{iid}</instanceId>".encode(),
                                f"<instanceId>{iid}</instanceId><spotInstanceRequestId>{sir}"
                                "</spotInstanceRequestId>".encode())
        return body

    def mangled(self, instance_id: str) -> str:
        return "i-" + "0" * 17

    def link(self, role: str) -> str:
        thing = self.things[role]
        kind = {"instance": "instance", "disk": "volume", "spot-request": "spot-instances-request"}[thing.kind]
        return f"arn:aws:ec2:{thing.region}:{self.account}:{kind}/{thing.id}"

    def _instance(self, role: str) -> dict[str, Any]:
        [inst] = self.ec2(role).describe_instances(InstanceIds=[self.things[role].id])["Reservations"][0]["Instances"]
        return dict(inst)

    def device(self, role: str) -> str:
        [volume] = self.ec2(role).describe_volumes(VolumeIds=[self.things[role].id])["Volumes"]
        [attachment] = volume["Attachments"]
        return str(attachment["Device"])

    def label(self, role: str, **changes: str | None) -> None:
        thing, ec2 = self.things[role], self.ec2(role)
        put = [{"Key": k, "Value": v} for k, v in changes.items() if v is not None]
        drop = [{"Key": k} for k, v in changes.items() if v is None]
        if put:
            ec2.create_tags(Resources=[thing.id], Tags=put)
        if drop:
            ec2.delete_tags(Resources=[thing.id], Tags=drop)

    def vanish(self, role: str) -> None:
        thing, ec2 = self.things[role], self.ec2(role)
        [volume] = ec2.describe_volumes(VolumeIds=[thing.id])["Volumes"]
        for attachment in volume["Attachments"]:  # detached first, as EC2 requires, then deleted
            ec2.detach_volume(VolumeId=thing.id, InstanceId=attachment["InstanceId"])
        ec2.delete_volume(VolumeId=thing.id)

    def manage(self, role: str) -> None:
        self.label(role, **{"eks:nodegroup-name": "workers"})

    def swap_boot(self, role: str, new_role: str) -> str:
        # As EC2 allows it: the instance stopped, its root volume detached, another volume
        # attached at RootDeviceName, then DeleteOnTermination turned on for that device.
        owner, ec2 = self.things[role], self.ec2(role)
        ec2.stop_instances(InstanceIds=[owner.id])
        inst = self._instance(role)
        root = inst["RootDeviceName"]
        [old] = [b["Ebs"]["VolumeId"] for b in inst["BlockDeviceMappings"] if b["DeviceName"] == root]
        ec2.detach_volume(VolumeId=old, InstanceId=owner.id)
        new = ec2.create_volume(AvailabilityZone=inst["Placement"]["AvailabilityZone"], Size=8)["VolumeId"]
        ec2.attach_volume(VolumeId=new, InstanceId=owner.id, Device=root)
        ec2.modify_instance_attribute(InstanceId=owner.id, BlockDeviceMappings=[
            {"DeviceName": root, "Ebs": {"DeleteOnTermination": True, "VolumeId": new}}])
        return self._keep(Thing(new_role, "disk", new, owner.region))

    def throttle(self, region: str) -> None:
        # Every request signed for that region gets EC2's RequestLimitExceeded (HTTP 503).
        self._throttled = True
        with self.proxy._lock:
            self.proxy.regions, self.proxy.share = frozenset({region}), 1.0

    def throttle_listing(self) -> None:
        # Every DescribeInstances (each region's first listing call) gets RequestLimitExceeded.
        self._throttled = True
        self.proxy.add_rule(Rule("DescribeInstances", reply=(503, [("Content-Type", "text/xml;charset=UTF-8")],
                                                             THROTTLED_BODY.format(rid="contract").encode())))

    def exists(self, role: str) -> bool:
        thing, ec2 = self.things[role], self.ec2(role)
        if thing.kind == "instance":
            reply = ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": [thing.id]}])
            states = [i["State"]["Name"] for r in reply["Reservations"] for i in r["Instances"]]
            return bool(states) and states[0] not in GONE_STATES
        if thing.kind == "disk":
            return bool(ec2.describe_volumes(Filters=[{"Name": "volume-id", "Values": [thing.id]}])["Volumes"])
        reply = ec2.describe_spot_instance_requests(Filters=[{"Name": "spot-instance-request-id",
                                                              "Values": [thing.id]}])
        return any(r["State"] not in ("cancelled", "closed") for r in reply["SpotInstanceRequests"])

    def wire_mutations(self) -> list[tuple[str, str]]:
        with self.proxy._lock:
            seen = list(self.proxy.mutations)
        return [(f"ec2:{action}", params.get(_WIRE_TARGET.get(action, ""), "?")) for action, params in seen]


# --- GCP ---------------------------------------------------------------------------------------------

#: ``DELETE .../zones/Z/instances/N``, ``POST .../zones/Z/disks/N/createSnapshot``...
_GCP_MUTATION = re.compile(r"/compute/v1/projects/[^/]+/(?:(?:zones|regions)/[^/]+|global)/"
                           r"(?P<coll>instances|disks|addresses|snapshots)/(?P<name>[^/]+)(?P<verb>/createSnapshot)?$")


class GcpDriver(Driver):
    """GCP lists with one ``aggregatedList`` per kind for the whole project, and Compute's
    rate quotas are the project's: one region's listing cannot be refused for its rate
    alone. ``throttle(region)`` is the fake's ``fail_region(region, 429)``: that region's
    zonal calls answer 429 ``rateLimitExceeded`` and aggregated lists show its scopes
    ``UNREACHABLE`` (as Compute shows a scope it cannot reach), so the region's failure
    says ``UNREACHABLE``; ``throttle_listing`` refuses the aggregated lists themselves."""

    cloud = "gcp"
    regions = ("us-central1", "europe-west1")
    region_throttled = "UNREACHABLE"
    ZONES = {"us-central1": "us-central1-a", "europe-west1": "europe-west1-b"}
    zone_key, other_zone, size_key, raw_state_key = "zone", "us-central1-b", "size_gb", "status"

    def __init__(self, db: Database, fake: FakeCompute) -> None:
        super().__init__(db)
        self.fake = fake

    @property
    def account(self) -> str:
        return self.fake.project

    def settings(self) -> Settings:
        return settings(self.margin_seconds, gcp_endpoint=self.fake.url)

    @staticmethod
    def _name(role: str) -> str:
        return re.sub(r"[^a-z0-9-]", "-", role.lower())

    def vm(self, role: str, ref: str, *, region: str | None = None, launched_ago: timedelta | None = None) -> str:
        region = region or self.regions[0]
        zone, name = self.ZONES[region], self._name(role)
        created = datetime.now(UTC) - (launched_ago or timedelta(0))
        vm = self.fake.add_instance(name, zone=zone, labels={DEFAULT_TAG_KEY: ref}, created=created)
        boot = self.fake.add_disk(f"{name}-boot", zone=zone, labels={DEFAULT_TAG_KEY: ref}, attached_to=name,
                                  auto_delete=True, boot=True, created=created)
        self._keep(Thing(f"{role}.boot", "disk", boot["id"], region, boot["name"], zone))
        return self._keep(Thing(role, "instance", vm["id"], region, name, zone))

    def disk(self, role: str, *, attach_to: str, labels: Mapping[str, str], auto_delete: bool) -> str:
        owner = self.things[attach_to]
        disk = self.fake.add_disk(self._name(role), zone=owner.location, labels=dict(labels),
                                  attached_to=owner.name, auto_delete=auto_delete)
        return self._keep(Thing(role, "disk", disk["id"], owner.region, disk["name"], owner.location))

    def volume(self, role: str, *, near: str, labels: Mapping[str, str], created_ago: timedelta | None = None) -> str:
        owner = self.things[near]
        disk = self.fake.add_disk(self._name(role), zone=owner.location, labels=dict(labels),
                                  created=datetime.now(UTC) - (created_ago or timedelta(0)))
        return self._keep(Thing(role, "disk", disk["id"], owner.region, disk["name"], owner.location))

    def attach(self, role: str, *, to: str) -> None:
        self.fake.attach_disk(self.things[to].name, self.things[role].name, zone=self.things[to].location)

    def mangled(self, instance_id: str) -> str:
        rounded = str(int(float(instance_id)))  # the id through a float64 and back (a JSON number in JavaScript)
        assert rounded != instance_id, instance_id
        return rounded

    def link(self, role: str) -> str:
        thing = self.things[role]
        body = self.fake.get(self._collection(thing), thing.location, thing.name)
        assert body is not None, role
        return str(body["selfLink"])

    def device(self, role: str) -> str:
        thing = self.things[role]
        link = self.link(role)
        for other in self.things.values():
            body = self.fake.get("instances", other.location, other.name) if other.kind == "instance" else None
            for attached in (body or {}).get("disks", []):
                if attached.get("source") == link:
                    return str(attached["deviceName"])
        raise AssertionError(f"{thing.role} is attached to no instance")

    def manage(self, role: str) -> None:
        thing = self.things[role]
        group = f"projects/{project_number(self.fake.project)}/zones/{thing.location}/instanceGroupManagers/workers"
        self.fake.set_field("instances", thing.location, thing.name, "metadata", {
            "kind": "compute#metadata", "fingerprint": "contract", "items": [{"key": "created-by", "value": group}]})

    def swap_boot(self, role: str, new_role: str) -> str:
        # As Compute Engine allows it: only on a stopped instance (the fake refuses it otherwise).
        owner = self.things[role]
        self.fake.set_status("instances", owner.location, owner.name, "TERMINATED")
        new = self.fake.add_disk(self._name(new_role), zone=owner.location)
        self.fake.swap_boot_disk(owner.name, new["name"], zone=owner.location, auto_delete=True)
        return self._keep(Thing(new_role, "disk", new["id"], owner.region, new["name"], owner.location))

    def _collection(self, thing: Thing) -> str:
        return {"instance": "instances", "disk": "disks"}[thing.kind]

    def label(self, role: str, **changes: str | None) -> None:
        thing = self.things[role]
        body = self.fake.get(self._collection(thing), thing.location, thing.name)
        assert body is not None, role
        labels = {**body.get("labels", {}), **changes}
        self.fake.set_labels(self._collection(thing), thing.location, thing.name,
                             {k: v for k, v in labels.items() if v is not None})

    def vanish(self, role: str) -> None:
        thing = self.things[role]
        disk = self.fake.get("disks", thing.location, thing.name)
        assert disk is not None, role
        for user in disk.get("users", []):  # detached first, as the API requires, then deleted
            owner = self.things[self.role_of(user.rsplit("/", 1)[1])]
            body = self.fake.get("instances", owner.location, owner.name)
            assert body is not None
            self.fake.set_field("instances", owner.location, owner.name, "disks",
                                [d for d in body["disks"] if d["source"] != disk["selfLink"]])
            self.fake.set_field("disks", thing.location, thing.name, "users", [])
        self.fake.remove("disks", thing.location, thing.name)

    def throttle(self, region: str) -> None:
        # Every call scoped to the region (or one of its zones) answers 429 rateLimitExceeded.
        self.fake.fail_region(region, status=429)

    def throttle_listing(self) -> None:
        # Every aggregated list answers 403 rateLimitExceeded (Compute's other rate refusal).
        self.fake.add_fault(path_contains="/aggregated/", status=403, reason="rateLimitExceeded")

    def exists(self, role: str) -> bool:
        thing = self.things[role]
        return self.fake.get(self._collection(thing), thing.location, thing.name) is not None

    def wire_mutations(self) -> list[tuple[str, str]]:
        out = []
        for call in self.fake.calls:
            m = _GCP_MUTATION.search(call.path)
            if m is None or (call.method, bool(m["verb"])) not in (("DELETE", False), ("POST", True)):
                continue
            what = "createSnapshot" if m["verb"] else "delete"
            out.append((f"compute.{m['coll']}.{what}", m["name"]))
        return out
