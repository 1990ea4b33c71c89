"""Cloud labels decided locally first (exporter/enrich/cloud_dmi.py): the metadata service of the
provider the machine's DMI names is asked, and only that one; no DMI, or DMI that names no cloud,
means no request at all.  The simulated node and the one-shot commands never ask.

The DMI strings are the providers' documented ones (AWS: "Identify EC2 Linux instances"; Azure:
the chassis asset tag cloud-init's DataSourceAzure checks; GCP: "Determining whether a VM runs on
Compute Engine"), as in ../shared/reference/schedulers.md.  One fake link-local service on
loopback speaks all three protocols, as 169.254.169.254 does, and records which were spoken."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest
import uge_netguard  # noqa: I001  (tests/netguard, put on sys.path by tests/conftest.py)
from aiohttp import web

from exporter.enrich import cloud
from exporter.enrich.cloud import CloudEnricher, CloudIdentity
from exporter.enrich.cloud_dmi import claimed_cloud
from tests.e2e_util import EXPORTER_CMD, ProcessSet, exporter, start_exporter, wait_until
from tests.test_cloud_enrich import aws_app, azure_app, gcp_app, start, url

DMI = {
    "aws-nitro": {"sys_vendor": "Amazon EC2", "product_name": "p4d.24xlarge", "bios_vendor": "Amazon EC2",
                  "board_vendor": "Amazon EC2", "chassis_asset_tag": "Amazon EC2"},
    "aws-xen": {"sys_vendor": "Xen", "product_name": "HVM domU", "bios_vendor": "Xen",
                "bios_version": "4.11.amazon"},
    "azure": {"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine",
              "bios_vendor": "Microsoft Corporation", "chassis_asset_tag": "7783-7084-3265-9085-8269-3286-77"},
    "gcp": {"sys_vendor": "Google", "product_name": "Google Compute Engine", "bios_vendor": "Google"},
    # not a cloud: a Hyper-V guest on premises, a Supermicro GPU server, a KVM VM
    "hyperv-onprem": {"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine",
                      "chassis_asset_tag": "0000-0000-0000-0000-0000-0000-00"},
    "baremetal": {"sys_vendor": "Supermicro", "product_name": "SYS-821GE-TNHR", "bios_vendor": "American Megatrends"},
    "kvm": {"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)", "bios_vendor": "SeaBIOS"},
}
CLAIMS = {"aws-nitro": "aws", "aws-xen": "aws", "azure": "azure", "gcp": "gcp"}


def sysfs_tree(root: Path, name: str | None) -> Path:
    """A sysfs tree with the named machine's DMI strings (None: no class/dmi at all)."""
    (root / "class" / "drm").mkdir(parents=True, exist_ok=True)
    if name is not None:
        dmi = root / "class" / "dmi" / "id"
        dmi.mkdir(parents=True)
        for field, value in DMI[name].items():
            (dmi / field).write_text(value + "\n")
    return root


def imds_app(hits: list) -> web.Application:
    """169.254.169.254 as the three clouds share it: every provider's routes on one server."""
    app = web.Application()
    for sub in (aws_app(hits), azure_app(hits), gcp_app(hits)):
        for route in sub.router.routes():
            app.router.add_route(route.method, route.resource.canonical, route.handler)
    return app


def provider_of(hit: tuple) -> str:
    path = hit[1]
    return "aws" if path.startswith("/latest") else "azure" if path.startswith("/metadata") else "gcp"


@pytest.mark.parametrize("name", sorted(DMI))
def test_dmi_names_the_provider_or_none(tmp_path, name):
    claim = claimed_cloud(sysfs_tree(tmp_path, name))
    assert claim.providers == ((CLAIMS[name],) if name in CLAIMS else ()), claim
    assert claim.evidence


def test_no_dmi_claims_nothing_and_says_why(tmp_path):
    claim = claimed_cloud(sysfs_tree(tmp_path, None))
    assert not claim and "no DMI identity" in claim.evidence


def test_an_oversized_or_odd_dmi_value_is_no_identity(tmp_path):
    root = sysfs_tree(tmp_path, None)
    dmi = root / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    (dmi / "sys_vendor").write_text("Amazon EC2" + " " * 4096)  # not a firmware string
    (dmi / "product_name").mkdir()  # a directory where a file should be
    assert claimed_cloud(root).providers == ()


@pytest.mark.asyncio
@pytest.mark.parametrize("name", sorted(CLAIMS))
async def test_only_the_provider_dmi_names_is_asked(tmp_path, monkeypatch, name):
    hits: list = []
    srv = await start(imds_app(hits))
    monkeypatch.setattr(cloud, "DEFAULT_ENDPOINTS", {p: url(srv) for p in ("aws", "azure", "gcp")})
    try:
        e = CloudEnricher({}, sysfs=sysfs_tree(tmp_path, name))
        ident = await e.refresh_once()
    finally:
        await srv.close()
    assert ident is not None and ident.cloud == CLAIMS[name]
    assert hits and {provider_of(h) for h in hits} == {CLAIMS[name]}, hits
    assert e.labels()["cloud"] == CLAIMS[name]


@pytest.mark.asyncio
@pytest.mark.parametrize("name", [None, "hyperv-onprem", "baremetal", "kvm"])
async def test_no_cloud_claimed_no_request_and_one_log_line(tmp_path, monkeypatch, caplog, name):
    hits: list = []
    srv = await start(imds_app(hits))
    monkeypatch.setattr(cloud, "DEFAULT_ENDPOINTS", {p: url(srv) for p in ("aws", "azure", "gcp")})
    try:
        e = CloudEnricher({}, sysfs=sysfs_tree(tmp_path, name))
        with caplog.at_level(logging.INFO, logger="exporter.enrich.cloud"):
            assert await e.refresh_once() is None
            await e.run()  # returns: nothing will ever be asked, no hourly loop
            await e.refresh_once()
    finally:
        await srv.close()
    assert hits == []
    said = [r.getMessage() for r in caplog.records if "no cloud metadata request" in r.getMessage()]
    assert len(said) == 1 and ("no DMI identity" in said[0] or "DMI names no cloud" in said[0]), said
    assert e.labels() == {}


@pytest.mark.asyncio
async def test_an_explicit_providers_entry_overrides_dmi(tmp_path, monkeypatch):
    """A container without the host's /sys/class/dmi: `providers: [gcp]` asks GCP anyway."""
    hits: list = []
    srv = await start(imds_app(hits))
    monkeypatch.setattr(cloud, "DEFAULT_ENDPOINTS", {p: url(srv) for p in ("aws", "azure", "gcp")})
    try:
        e = CloudEnricher({"providers": ["gcp"]}, sysfs=sysfs_tree(tmp_path, None))
        ident = await e.refresh_once()
    finally:
        await srv.close()
    assert ident is not None and ident.cloud == "gcp" and {provider_of(h) for h in hits} == {"gcp"}


@pytest.mark.asyncio
async def test_the_simulated_node_takes_its_scenarios_identity_and_asks_nobody(tmp_path, monkeypatch):
    hits: list = []
    srv = await start(imds_app(hits))
    monkeypatch.setattr(cloud, "DEFAULT_ENDPOINTS", {p: url(srv) for p in ("aws", "azure", "gcp")})
    static = CloudIdentity("azure", region="westeurope", zone="2", instance_type="Standard_ND96asr_v4")
    try:
        # the machine running the simulator is on AWS: that is not the simulated node's cloud
        e = CloudEnricher({}, sysfs=sysfs_tree(tmp_path, "aws-nitro"), simulated=True, static=static)
        assert await e.refresh_once() == static
        bare = CloudEnricher({}, sysfs=sysfs_tree(tmp_path / "b", "gcp"), simulated=True)
        assert await bare.refresh_once() is None
    finally:
        await srv.close()
    assert hits == []
    assert e.labels() == {"cloud": "azure", "region": "westeurope", "zone": "2",
                          "instance_type": "Standard_ND96asr_v4"}


# ---- the daemon: which commands may ask, seen by the network guard ------------------------------

def _refusals(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def private_log(tmp_path, monkeypatch):
    log = tmp_path / "guard.jsonl"
    monkeypatch.setenv(uge_netguard.LOG_ENV, str(log))
    return log


def test_a_real_start_on_a_cloud_claimed_by_dmi_asks_its_metadata_service(tmp_path, private_log):
    """The control: the daemon on a GCP machine asks 169.254.169.254, which the guard refuses;
    the same start without DMI asks nothing and logs why."""
    for name in ("gcp", None):
        sysfs = sysfs_tree(tmp_path / f"sys-{name}", name)
        with ProcessSet() as procs:
            # no GPU here: /readyz stays 503, /healthz answers once it serves
            srv = procs.add(exporter(tmp_path / f"run-{name}",
                                     ["--path.sysfs", str(sysfs), "--path.procfs", str(tmp_path),
                                      "--state.dir", str(tmp_path / f"state-{name}")]))
            srv.start().wait_ready("/healthz", 60)
            if name == "gcp":
                wait_until(lambda: _refusals(private_log), 30, what="the metadata request")
            else:
                wait_until(lambda s=srv: "no cloud metadata request" in s.log(), 30, what="the log line")
        got = {(r["event"], r["address"]) for r in _refusals(private_log)}
        assert got == {("socket.connect", "('169.254.169.254', 80)")}, got
    assert "no DMI identity" in srv.log()


@pytest.mark.parametrize("args", [
    ["--simulate"],
    ["--simulate", "--once"],
    ["--once"],
    ["--check-config"],
    ["--list-devices"],
])
def test_the_simulator_and_one_shot_commands_never_ask(tmp_path, private_log, args):
    """Run on a machine whose DMI says GCP: none of these may contact a metadata service."""
    sysfs = sysfs_tree(tmp_path / "sys", "gcp")
    common = ["--path.sysfs", str(sysfs), "--path.procfs", str(tmp_path), "--state.dir", str(tmp_path / "st")]
    if args == ["--simulate"]:
        with ProcessSet() as procs:
            srv = start_exporter(procs, tmp_path, [*args, *common], timeout=60)
            wait_until(lambda: "no cloud metadata request" in srv.log(), 30, what="the log line")
    else:
        subprocess.run([*EXPORTER_CMD, *args, *common], capture_output=True, timeout=120, cwd=tmp_path)
    assert _refusals(private_log) == []


def test_import_never_asks(tmp_path, private_log, shared_fixtures):
    artefact = next(iter(sorted((shared_fixtures / "profilers").rglob("*.csv"))))
    subprocess.run([*EXPORTER_CMD, "import", str(artefact)], capture_output=True, timeout=120)
    assert _refusals(private_log) == []


def test_a_scenario_gives_the_simulated_node_its_cloud_labels(tmp_path):
    from exporter.simulate import load_scenario

    src = Path(cloud.__file__).resolve().parents[2] / "mappings" / "scenarios" / "demo.yaml"
    text = src.read_text() + ("\ncloud: {cloud: gcp, region: europe-west4, zone: europe-west4-a, "
                              "instance_type: a3-highgpu-8g}\n")
    path = tmp_path / "cloudy.yaml"
    path.write_text(text)
    scenario = load_scenario(str(path))
    assert scenario.cloud is not None and scenario.cloud.cloud == "gcp"
    out = subprocess.run([*EXPORTER_CMD, "--simulate", str(path), "--once", "--path.sysfs", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'cloud="gcp"' in out.stdout and 'region="europe-west4"' in out.stdout
