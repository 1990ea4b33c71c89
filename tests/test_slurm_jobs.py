"""A real Slurm on this machine (Debian's slurmctld, slurmd, munge; one node with GRES gpu on
device nodes made for the test) runs deploy/slurm/gpu-job-map.sh as its Prolog and Epilog
(PrologFlags=Alloc): a job's id, user, partition and cluster appear on its GPU's gpu_job_info
within a refresh period and a poll of the prolog and leave as soon after the epilog, in both formats.

Everything listens on 127.0.0.1 on free ports; the daemons run in the foreground in their own
sessions and are stopped at the end."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, require_binary
from tests.e2e_util import ProcessSet, Server, free_port, http_get, start_exporter, wait_until
from tests.test_hpc_jobs import REFRESH, _job_lines, scrape_after

SCRIPT = REPO / "deploy" / "slurm" / "gpu-job-map.sh"


def _daemon(procs: ProcessSet, name: str, argv: list[str], tmp: Path, env: dict) -> Server:
    server = procs.add(Server(name, argv, 0, tmp / f"{name}.log", env=env))
    server.start()
    return server


@pytest.fixture
def slurm(tmp_path):
    for binary, package in (("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"),
                            ("sbatch", "slurm-client"), ("squeue", "slurm-client")):
        require_binary(binary, package)
    if os.geteuid() != 0:
        pytest.skip("slurmd runs jobs and its prolog as root, and the fake GPUs need mknod")
    s = tmp_path
    for d in ("state", "spool", "munge", "jobs", "dev"):
        (s / d).mkdir(mode=0o700)
    (s / "jobs").chmod(0o755)
    key = s / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for i in (0, 1):  # NVIDIA's character devices (major 195), nothing behind them
        os.mknod(s / "dev" / f"nvidia{i}", 0o600 | 0o020000, os.makedev(195, i))
    for action in ("prolog", "epilog"):  # the shipped script, the format chosen per job by a file
        wrapper = s / f"{action}.sh"
        wrapper.write_text(f"#!/bin/bash\nexport UGX_JOB_MAP_DIR={s}/jobs\n"
                           f"export UGX_JOB_MAP_FORMAT=$(cat {s}/format)\nexec {SCRIPT}\n")
        wrapper.chmod(0o755)
    host = socket.gethostname().split(".")[0]
    sock = s / "munge" / "munge.sock"
    conf = s / "slurm.conf"
    conf.write_text(f"""ClusterName=ugxtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={s}/state
SlurmdSpoolDir={s}/spool
SlurmctldPidFile={s}/slurmctld.pid
SlurmdPidFile={s}/slurmd.pid
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
GresTypes=gpu
PrologFlags=Alloc
Prolog={s}/prolog.sh
Epilog={s}/epilog.sh
SchedulerType=sched/builtin
SelectType=select/cons_tres
ReturnToService=2
NodeName=ugxnode NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:2 State=UNKNOWN
PartitionName=gpus Nodes=ugxnode Default=YES State=UP
""")
    (s / "gres.conf").write_text(f"Name=gpu File={s}/dev/nvidia[0-1]\n")
    env = dict(os.environ, SLURM_CONF=str(conf))
    with ProcessSet() as procs:
        _daemon(procs, "munged", ["munged", "-F", "-f", f"--socket={sock}", f"--key-file={key}",
                                  f"--log-file={s}/munged.log", f"--pid-file={s}/munge/munged.pid",
                                  f"--seed-file={s}/munge/seed"], s, env)
        wait_until(sock.exists, 20, what="munged's socket")
        _daemon(procs, "slurmctld", ["slurmctld", "-D", "-f", str(conf)], s, env)
        _daemon(procs, "slurmd", ["slurmd", "-D", "-N", "ugxnode", "-f", str(conf)], s, env)

        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=20)
            return out.stdout.strip() == "idle"

        try:
            wait_until(idle, 60, interval=0.5, what="the Slurm node idle")
        except AssertionError:
            raise AssertionError("Slurm did not come up:\n" + "\n".join(
                p.read_text(errors="replace")[-2000:] for p in s.glob("*.log"))) from None
        yield s, env


def test_a_slurm_jobs_gpu_shows_its_job_from_prolog_to_epilog(slurm, tmp_path_factory):
    s, env = slurm
    jobs = s / "jobs"
    tmp = tmp_path_factory.mktemp("exporter")
    cfg = tmp / "config.yml"
    cfg.write_text(f"enrich:\n  cloud: {{enabled: false}}\n  hpc_jobs:\n    directory: {jobs}\n"
                   f"    vendors: [nvidia]\n    refresh_seconds: {REFRESH}\n")
    with ProcessSet() as procs:
        server = start_exporter(procs, tmp, ["--simulate", "--poll.interval", "250ms", "--config.file", str(cfg)])
        for n, fmt in enumerate(("json", "dcgm")):
            (s / "format").write_text(fmt)
            release = s / f"release{n}"
            job = subprocess.run(
                ["sbatch", "--parsable", "--gres=gpu:1", "-o", str(s / f"job{n}.out"),
                 "--wrap", f"while [ ! -e {release} ]; do sleep 0.2; done"],
                env=env, capture_output=True, text=True, timeout=30, check=True).stdout.strip().split(";")[0]
            assert job.isdigit(), job
            # the prolog wrote the mapping file of the job's GPU (Slurm gives GPU 0 first)
            wait_until(lambda: (jobs / "0").exists(), 60, interval=0.2, what=f"the prolog of job {job} ({fmt})")
            lines = _job_lines(scrape_after(server, time.time(), lambda b: _job_lines(b) != []))
            assert len(lines) == 1, lines
            line = lines[0]
            assert 'vendor="nvidia"' in line and 'gpu="0"' in line and f'job_id="{job}"' in line, line
            if fmt == "json":  # the JSON format carries the job's user, partition and cluster
                assert 'job_user="root"' in line and 'job_partition="gpus"' in line, line
                assert 'job_cluster="ugxtest"' in line, line
            else:
                assert "job_user" not in line, line
            # the job ends; the epilog clears the file
            release.touch()
            wait_until(lambda: not (jobs / "0").exists(), 60, interval=0.2, what=f"the epilog of job {job} ({fmt})")
            assert _job_lines(scrape_after(server, time.time(), lambda b: _job_lines(b) == [])) == []
        body = http_get(server.url + "/metrics").text
        assert re.search(r'hpc_job_files_refused_total\{reason="malformed"\} 0', body), "a file of ours refused"
