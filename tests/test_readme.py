"""The README's adoption example must run exactly as written."""
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def adopted_loop_from_readme() -> str:
    diff = re.search(r"```diff\n(.*?)```", README.read_text(), re.S).group(1)
    lines = [line[1:] for line in diff.splitlines() if line[:1] in (" ", "+")]
    return "\n".join(lines) + "\n"


def plain_loop_from_readme() -> str:
    diff = re.search(r"```diff\n(.*?)```", README.read_text(), re.S).group(1)
    return "\n".join(line[1:] for line in diff.splitlines() if line[:1] in (" ", "-")) + "\n"


def test_readme_adoption_example_runs_and_trains():
    code = adopted_loop_from_readme() + "assert engine.optimizer_steps > 0 and engine.k in range(4, 9)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "'next_k_micro_batches':" in result.stdout


def test_readme_plain_loop_is_the_diff_base():
    result = subprocess.run([sys.executable, "-c", plain_loop_from_readme()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_readme_per_step_loop_runs_with_the_names_a_script_has():
    snippet = re.search(r"keeps its shape:\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    setup = (
        "import torch, torch.nn.functional as F, trainopt_core\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))\n"
        "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
        "config = trainopt_core.OptimizationConfig(k=2, schedule='cosine')\n"
        "batch_size, max_iters, warmup_iters, min_lr, eval_interval = 4, 12, 3, 1e-4, 5\n"
        "def get_batch():\n    x = torch.randn(batch_size, 8)\n    return x, (x[:, 0] > 0).long()\n"
        "evaluations = []\n"
        "def evaluate():\n    evaluations.append(engine.optimizer_steps)\n"
    )
    check = "assert engine.optimizer_steps == 12 and evaluations == [5, 10], (engine.optimizer_steps, evaluations)\n"
    result = subprocess.run([sys.executable, "-c", setup + snippet + check], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_readme_plan_example_runs_and_prepares_the_chosen_configuration():
    snippet = re.search(r"```python\n(result = trainopt_core\.plan\(.*?)```", README.read_text(), re.S).group(1)
    setup = (
        "import matplotlib\nmatplotlib.use('Agg')\n"
        "import torch, torch.nn.functional as F, trainopt_core\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))\n"
        "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
        "x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))\n"
    )
    check = ("assert engine.config == result.config and result.chosen['feasible'], result.explain()\n"
             "assert 'Chose' in result.explain() and len(result.frame()) >= 4\n")
    result = subprocess.run([sys.executable, "-c", setup + snippet + check], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_readme_plan_example_for_a_script_keeps_the_scripts_configuration():
    snippet = re.search(r"```python\n(result = trainopt_core\.plan\(model, lambda m: .*?)```", README.read_text(),
                        re.S).group(1)
    setup = (
        "import torch, trainopt_core\n"
        "torch.manual_seed(0)\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))\n"
        "    def forward(self, x, targets=None):\n"
        "        logits = self.net(x)\n"
        "        return logits, torch.nn.functional.cross_entropy(logits, targets)\n"
        "    def configure_optimizers(self, weight_decay, learning_rate, betas):\n"
        "        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)\n"
        "model = Model()\n"
        "weight_decay, learning_rate, betas, max_iters, warmup_iters, min_lr = 0.1, 1e-3, (0.9, 0.95), 20, 2, 1e-4\n"
        "optimizer = model.configure_optimizers(weight_decay, learning_rate, betas)\n"
        "config = trainopt_core.OptimizationConfig(k=2, schedule='cosine', clip_norm=1.0)\n"
        "x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))\n"
    )
    check = ("assert (engine.config.schedule, engine.config.clip_norm) == ('cosine', 1.0), engine.config\n"
             "assert any(row.get('yours') for row in result.rows)\n")
    result = subprocess.run([sys.executable, "-c", setup + snippet + check], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_the_readme_answers_on_its_first_screen():
    lines = README.read_text().splitlines()
    end = next(i for i, line in enumerate(lines, 1) if line.startswith("<!-- summary:end -->"))
    assert end <= 60, f"the summary block ends on line {end}: the answer belongs in the first 60 lines"
    assert len(lines) <= 250, f"README.md has {len(lines)} lines"
    # the GPU paragraph follows the two commands a reader runs first
    assert lines.index("## The two commands") < lines.index("<!-- gpu:start -->") < lines.index(
        "## Adopting the components in your own loop")
