"""The package's shape: subpackages, no standard-library shadowing, the console script."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_repository_root_does_not_shadow_the_standard_library_operator():
    for flags in ([], ["-S"], ["-I"]):
        out = subprocess.run(
            [sys.executable, *flags, "-c", "import operator; print(operator.__file__)"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert not out.startswith(str(ROOT)), f"python {' '.join(flags)} imported {out}"


def test_parts_are_subpackages_of_flashrt():
    import flashrt.kernels
    import flashrt.operator.constants
    import flashrt.runtime

    assert flashrt.operator.constants.GROUP == "flashrt.io"
    assert flashrt.kernels.__name__ == "flashrt.kernels" and flashrt.runtime.__name__ == "flashrt.runtime"


def test_operator_part_never_imports_torch():
    code = "import sys, flashrt.operator.constants; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_console_script_answers():
    exe = Path(sys.executable).with_name("flashrt")
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("flashrt ")
