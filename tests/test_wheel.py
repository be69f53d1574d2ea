"""The wheel ships the model and deployment configs: installed non-editable, ``dsv41 plan`` finds them."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_install_runs_plan_with_bundled_configs(tmp_path):
    wheels, target, src = tmp_path / "wheels", tmp_path / "site", tmp_path / "src"
    # Built from a copy: the build leaves no build/ or egg-info (nor stale modules) in the repo.
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src / "pyproject.toml")
    shutil.copytree(ROOT / "dsv41", src / "dsv41", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(wheels)],
                   check=True, cwd=tmp_path, capture_output=True)  # fmt: skip
    (wheel,) = wheels.glob("dsv41-*.whl")
    subprocess.run(pip + ["install", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, cwd=tmp_path, capture_output=True)  # fmt: skip
    shipped = {p.relative_to(target / "dsv41" / "configs").as_posix()
               for p in (target / "dsv41" / "configs").rglob("*.yaml")}  # fmt: skip
    source = {p.relative_to(ROOT / "dsv41" / "configs").as_posix()
              for p in (ROOT / "dsv41" / "configs").rglob("*.yaml")}  # fmt: skip
    assert shipped == source and "models/tiny.yaml" in shipped
    # The installed package only: the repository is neither the cwd nor on the path.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(target)}
    script = target / "bin" / "dsv41"  # the console script pip wrote
    where = [sys.executable, "-c", "import dsv41; print(dsv41.__file__)"]
    found = subprocess.run(where, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert found.stdout.startswith(str(target)), found.stdout
    for args, expect in ((["plan", "--config", "tiny", "--tp", "2"], "tiny"),
                         (["plan", "--config", "dsv41-flash", "--tp", "4"], "dsv41-flash")):  # fmt: skip
        out = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[:2] == ["model", expect], out.stdout
