"""The environment a set of runs was measured in, from their records' manifests: the hardware
line of a run, and data, models, hardware, versions, pins, commit and dates of a set of runs."""
from __future__ import annotations


def _flatten(value, prefix: str = "") -> dict[str, str]:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, (list, tuple)):
        return {prefix: ", ".join(str(v) for v in value)}
    return {prefix: str(value)}


def _find(manifest: dict, *words: str) -> dict[str, str]:
    flat = _flatten(manifest)
    return {k: v for k, v in flat.items() if any(w in k.lower() for w in words) and v not in ("None", "")}


def describe_hardware(manifest: dict) -> str:
    """One line naming the device(s) of a run from its manifest (`measure.run_manifest`):
    GPU names (and driver) when CUDA ran, else the CPU model and its logical cores."""
    if not manifest:
        return ""
    hardware = manifest.get("hardware") or {}
    gpus = [g for g in hardware.get("gpus") or [] if isinstance(g, dict)]
    device = str(manifest.get("device") or "")
    if gpus and not device.startswith("cpu"):
        names = [g.get("name", "?") for g in gpus]
        counts = {n: names.count(n) for n in dict.fromkeys(names)}
        driver = gpus[0].get("driver")
        return "GPU " + ", ".join(f"{c}x {n}" for n, c in counts.items()) + (f" (driver {driver})" if driver else "")
    if hardware.get("cpu_model") or hardware.get("cpu_logical_cores"):
        cores = hardware.get("cpu_logical_cores")
        details = [hardware.get("cpu_id"), hardware.get("cpu_isa"), f"{cores} logical cores" if cores else None]
        details = [d for d in details if d]
        return f"CPU {hardware.get('cpu_model') or 'unknown model'}" + (f" ({', '.join(details)})" if details else "")
    # another manifest layout: whatever names a device
    found = _find(manifest, "gpu", "cpu", "device")
    return "; ".join(f"{k}={v}" for k, v in list(found.items())[:3])


def describe_manifest(records: list[dict]) -> dict[str, str]:
    """The environment of a set of runs, for the reports index: data sources, models, hardware,
    library versions, git commit(s) and the date range, gathered from the records' manifests."""
    def distinct(values):
        return "; ".join(sorted({str(v) for v in values if v})) or "—"

    manifests = [r.get("manifest", {}) or {} for r in records]
    versions: dict[str, set] = {}
    for m in manifests:
        libraries = m.get("libraries") or m.get("versions") or {}
        for name, version in (libraries.items() if isinstance(libraries, dict) else []):
            if version:
                versions.setdefault(name, set()).add(str(version))
    commits = []
    for m in manifests:
        git = m.get("git") if isinstance(m.get("git"), dict) else {}
        commit = git.get("commit") or m.get("git_commit")
        if commit:
            commits.append(f"{commit}{' (uncommitted changes)' if git.get('dirty') else ''}")
    dates = sorted(str(m.get("date_utc") or m.get("date")) for m in manifests if m.get("date_utc") or m.get("date"))
    off_pins = [m["releases_off_pins"] for m in manifests if isinstance(m.get("releases_off_pins"), dict)]
    off = sorted({f"{name} {version}" for found in off_pins for name, version in found.items()})
    if not off_pins:
        pinned = "not recorded"
    else:
        pinned = f"installed at other releases: {', '.join(off)}" if off else "every installed package at its pin"
        if len(off_pins) < len(manifests):
            pinned += f" ({len(off_pins)} of {len(manifests)} runs recorded it)"
    return {
        "Data": distinct(r.get("data_source") for r in records),
        "Models": distinct(r.get("model_name") for r in records),
        "Hardware": distinct(describe_hardware(m) for m in manifests),
        "Versions": ", ".join(f"{k} {'/'.join(sorted(v))}" for k, v in sorted(versions.items())) or "—",
        "Pinned releases (constraints.txt)": pinned,
        "Git commit": distinct(commits),
        "Date (UTC)": (dates[0] if dates[0] == dates[-1] else f"{dates[0]} … {dates[-1]}") if dates else "—",
        "Runs": f"{len(records)} complete record(s): " + distinct(
            f"{r.get('task')}/{r.get('config_name')}" for r in records),
    }
