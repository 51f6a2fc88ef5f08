"""Fixtures of the tuning tests: a tiny base run config and space, and a real PostgreSQL server."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: A trial of a few hundred env steps with small networks (seconds on a CPU).
TINY_CONFIG = {
    "steps": 200,
    "n_envs": 4,
    "eval_steps": 20,
    "synthetic_market_steps": 1000,
    "threads": 1,
    "algorithm": {"learning_starts": 40, "buffer_size": 1000, "diagnostics_interval": 100},
    "policy": {
        "n_ensemble": 1,
        "n_cos": 8,
        "n_quantiles": 4,
        "n_quantiles_target": 4,
        "n_quantiles_act": 4,
        "n_atoms": 11,
    },
    "env": {"episode_length": 50},
}
#: A small space: tiny networks, a couple of searched knobs, hindsight off (fewer parameters, faster).
TINY_SPACE = """\
net_width: {type: categorical, choices: [8, 16]}
batch_size: 16
learning_rate: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}
gamma: {type: float, low: 0.9, high: 0.99}
hindsight: false
"""


@pytest.fixture(autouse=True)
def restore_torch_threads() -> Iterator[None]:
    """A trial sets the torch thread count (``RunConfig.threads``); put it back afterwards."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_files(tmp_path: Path) -> tuple[Path, Path]:
    """``(base config JSON, space YAML)`` of a tiny study."""
    config, space = tmp_path / "base.json", tmp_path / "space.yaml"
    config.write_text(json.dumps(TINY_CONFIG))
    space.write_text(TINY_SPACE)
    return config, space


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server started in a temporary folder (as the ``postgres`` user when run as root).

    Skipped only where the server binaries are absent and the ``CI`` environment variable is unset; in CI
    a missing server fails the test (``.ci/run`` installs it).
    """
    initdb = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    found = initdb[-1] if initdb else shutil.which("initdb")
    try:
        import psycopg  # SQLAlchemy 2.1's driver of postgresql:// URLs
    except ImportError:
        psycopg = None
    if found is None or psycopg is None:
        what = "PostgreSQL server binaries (initdb)" if found is None else "psycopg (the test extra)"
        if os.environ.get("CI"):
            pytest.fail(f"{what} missing in CI (.ci/run installs them)")
        pytest.skip(f"{what} not installed")
    bindir = Path(found).parent
    root = Path(tempfile.mkdtemp(prefix="foxhunt-pg-", dir="/tmp"))
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    if as_root:
        shutil.chown(root, "postgres", "postgres")
    data, port = root / "data", _free_port()
    run = dict(check=True, cwd=root, capture_output=True, text=True)
    try:
        subprocess.run(
            [
                *prefix,
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            **run,
        )
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            [
                *prefix,
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(root / "server.log"),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ],
            **run,
        )
        with psycopg.connect(
            host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True
        ) as connection:
            connection.execute("CREATE DATABASE foxhunt_test")
        url = f"postgresql://postgres@127.0.0.1:{port}/foxhunt_test"
        import optuna

        optuna.storages.RDBStorage(url)  # creates the tables once: workers that start together do not race
        yield url
    except subprocess.CalledProcessError as error:
        log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
        raise RuntimeError(f"PostgreSQL did not start: {error.stderr}\n{log}") from error
    finally:
        subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            cwd=root,
            capture_output=True,
        )
        time.sleep(0.2)
        shutil.rmtree(root, ignore_errors=True)
