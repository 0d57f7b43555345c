"""Where data comes from (SPEC §5), shared by the image and text loaders.

Resolution order for every data set: a local copy -> a download (only when allowed, failing
fast) -> an honest stand-in with a loud warning. This module holds the data directory and
download switches, the `data_policy` ("auto" | "real" | "standin") and the stand-in warning.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import warnings
from pathlib import Path


CHECKOUT = Path(__file__).resolve().parents[3]  # trainopt_core/reproduction/data/ -> the checkout

DATA_POLICIES = ("auto", "real", "standin")
DATA_DIR_ENV = "TRAINOPT_DATA_DIR"
ALLOW_DOWNLOAD_ENV = "TRAINOPT_ALLOW_DOWNLOAD"
# A download is attempted only after the host answers a TCP connect within this bound, so a
# machine without network fails in well under a second instead of waiting on library retries.
DOWNLOAD_PROBE_TIMEOUT_S = 3.0
DOWNLOAD_TIMEOUT_S = 30.0


class StandinDataWarning(UserWarning):
    """A stand-in data set is used instead of the real one (CIFAR-10 / WikiText-2)."""


class DataNotFoundError(FileNotFoundError):
    """The real data set was required (data_policy="real") but no copy could be found."""


# ---------------------------------------------------------------- where data lives, policy
def default_data_dir() -> Path:
    """`$TRAINOPT_DATA_DIR`, else `<repository>/data` when run from a checkout, else `./data`."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    if (CHECKOUT / "pyproject.toml").is_file():
        return CHECKOUT / "data"
    return Path.cwd() / "data"


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """`data_dir` as a Path, or `default_data_dir()` when None."""
    return default_data_dir() if data_dir is None else Path(data_dir).expanduser()


def default_cache_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Where token tensors and generated stand-ins are cached: `<data_dir>/cache`."""
    return resolve_data_dir(data_dir) / "cache"


def downloads_allowed(allow_download: bool | None) -> bool:
    """`allow_download` if given, else True only when `$TRAINOPT_ALLOW_DOWNLOAD=1`."""
    if allow_download is None:
        return os.environ.get(ALLOW_DOWNLOAD_ENV, "0").strip() == "1"
    if not isinstance(allow_download, bool):
        raise ValueError(f"allow_download={allow_download!r} is invalid: allowed True, False or None")
    return allow_download


def check_data_policy(data_policy: str) -> str:
    """Validate `data_policy`: "auto" (real if found, else stand-in), "real" or "standin"."""
    if data_policy not in DATA_POLICIES:
        raise ValueError(f"data_policy={data_policy!r} is invalid: allowed one of {DATA_POLICIES}")
    return data_policy


def host_reachable(host: str, port: int = 443, timeout_s: float = DOWNLOAD_PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to host:port opens within `timeout_s` (DNS included)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


_ANNOUNCED: set[str] = set()  # the stand-in notices this process has shown


def checkout_relative(text: str) -> str:
    """`text` with the checkout's absolute path written as `.`: a notice in an executed notebook
    does not carry the paths of the machine that made it."""
    root = str(CHECKOUT)
    if not (CHECKOUT / "pyproject.toml").is_file() or root not in text:
        return text
    return text.replace(root, ".") + " (paths relative to the trainopt checkout)"


def warn_standin(message: str) -> None:
    """The loud stand-in notice, as one `StandinDataWarning`, once per process for each message (a
    notebook loads the same data set for dozens of runs; the first notice says it for all)."""
    banner = checkout_relative(f"STAND-IN DATA: {message}")
    if banner in _ANNOUNCED:
        return
    _ANNOUNCED.add(banner)
    warnings.warn(banner, StandinDataWarning, stacklevel=3)


def params_key(params: dict) -> str:
    """A short stable hash of JSON-able parameters, used to name cache files."""
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
