"""Calibration aid: run the quick baseline (the real runner: augmentation, evaluation) of a task with
profile settings and image stand-in style overridden, and print its quality curve.

    python benchmarks/probes/standin/try_standin.py cifar10 '{"lr": 5e-3}' '{"pixel_noise": 0.1}' [seed]
    python benchmarks/probes/standin/try_standin.py wikitext2 '{"lr": 2e-3, "epochs": 2}' '{}' [seed [config [record.json]]]

Used to choose STANDIN_STYLE and the quick profiles' settings (docs/data.md, "The stand-ins and the quick profile's targets").
"""
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from trainopt_core.reproduction import profiles, runner  # noqa: E402
from trainopt_core.reproduction.data import images  # noqa: E402

if len(sys.argv) < 2 or sys.argv[1] not in profiles.TASKS:
    sys.exit(f"task={sys.argv[1] if len(sys.argv) > 1 else None!r} is invalid: allowed one of {sorted(profiles.TASKS)}\n"
             + __doc__)
task = sys.argv[1]
settings = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
style = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
config = sys.argv[5] if len(sys.argv) > 5 else "baseline"
images.STANDIN_STYLE.update({k: tuple(v) if isinstance(v, list) else v for k, v in style.items()})
key = (task, "quick")
profiles._PROFILES[key] = dataclasses.replace(profiles._PROFILES[key], **settings)
with tempfile.TemporaryDirectory() as out:
    record = runner.run(task, config, profile="quick", seed=seed, out_dir=out, data_policy="standin",
                        rerun=True, progress=False)
if len(sys.argv) > 6:
    Path(sys.argv[6]).write_text(json.dumps(record))
for point in record["history"]:
    print(point["samples"], round(point["quality"], 3), point["train_loss"] and round(point["train_loss"], 3),
          round(point["time_s"], 1), point["k"], point["b_simple"])
print("metrics:", {k: v for k, v in record["metrics"].items() if not isinstance(v, (dict, list))})
