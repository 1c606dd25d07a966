"""Cloud Custodian for the peers benchmark: its own virtualenv, and ``custodian run`` as a lister.

c7n is pinned (``C7N_VERSION``) and installed from PyPI on first use into
``~/.cache/orphan-cleanup/bench-peers/c7n-VERSION`` (``$XDG_CACHE_HOME`` honoured),
never into the project's environment; a virtualenv that exists and answers
``custodian version`` with the pin is reused.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench.listing import TAG
from bench.listing_aws import REGION

C7N_VERSION = "0.9.53"
C7N_POLICIES = (("ec2", "aws.ec2", "InstanceId"), ("ebs", "aws.ebs", "VolumeId"),
                ("eni", "aws.eni", "NetworkInterfaceId"))


class PeerUnavailable(RuntimeError):
    """The peer tool could not be installed or does not run."""


def custodian_lister(exe: Path, endpoint: str, workdir: Path) -> Callable[[], set[str]]:
    from tests.support.moto import FAKE_ENV, UNSET_ENV

    policy = workdir / "policy.yml"
    policy.write_text(json.dumps({"policies": [
        {"name": name, "resource": resource, "filters": [{f"tag:{TAG}": "present"}]}
        for name, resource, _ in C7N_POLICIES]}))  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if k not in UNSET_ENV and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(FAKE_ENV, AWS_ENDPOINT_URL=endpoint)
    out = workdir / "out"
    cmd = [str(exe), "run", "--cache-period", "0", "-r", REGION, "-s", str(out), str(policy)]

    def listing() -> set[str]:
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError("custodian run timed out") from exc
        if done.returncode:
            raise RuntimeError(f"custodian run failed ({done.returncode}): {done.stderr.strip()[-300:]}")
        ids: set[str] = set()
        for name, _, id_field in C7N_POLICIES:
            ids.update(r[id_field] for r in json.loads((out / name / "resources.json").read_text()))
        return ids

    return listing


def ensure_custodian(root: Path | None = None) -> Path:
    """The ``custodian`` executable of the pinned c7n, installing it on first use."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = root or base / "orphan-cleanup" / "bench-peers" / f"c7n-{C7N_VERSION}"
    exe = root / "bin" / "custodian"
    if _version(exe) == C7N_VERSION:
        return exe
    print(f"-- peers: installing c7n {C7N_VERSION} into {root} (once) ...", file=sys.stderr, flush=True)
    shutil.rmtree(root, ignore_errors=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, capture_output=True, timeout=300)
        subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--retries", "1", "--timeout",
                        "20", f"c7n=={C7N_VERSION}"], check=True, capture_output=True, text=True, timeout=900)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(root, ignore_errors=True)
        tail = (exc.stderr or "").strip().splitlines()[-1:] or [str(exc)]
        raise PeerUnavailable(f"cannot install c7n {C7N_VERSION} from PyPI: {tail[0][:200]}") from exc
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise PeerUnavailable(f"installing c7n {C7N_VERSION} timed out") from exc
    if _version(exe) != C7N_VERSION:
        raise PeerUnavailable(f"c7n {C7N_VERSION} installed in {root} but `custodian version` does not say so")
    return exe


def _version(exe: Path) -> str | None:
    if not exe.exists():
        return None
    try:
        done = subprocess.run([str(exe), "version"], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
