"""One training run per output folder: a live run's lock refuses a second run by name; a killed run's lock is
recovered by the next run (the kernel releases a dead process's flock)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atr_llm.command_line import UsageError
from atr_llm.run_lock import LOCK_NAME, output_dir_lock

ROOT = Path(__file__).resolve().parents[1]
HOLD = "import sys, time; from pathlib import Path; from atr_llm.run_lock import output_dir_lock\n"
HOLD += "with output_dir_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(120)\n"


def _holder(out: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_folder_is_refused_naming_it_and_the_holder(tmp_path):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(UsageError, match=rf"--output_dir {tmp_path}: another training \(pid {proc.pid}\)"):
            with output_dir_lock(tmp_path):
                pass
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_runs_lock_is_recovered(tmp_path):
    proc = _holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (tmp_path / LOCK_NAME).exists()  # the file stays; the lock died with its holder
    with output_dir_lock(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    with output_dir_lock(tmp_path):  # released at the end of the block, taken again
        pass


def test_only_the_main_process_of_a_launch_takes_it(tmp_path, monkeypatch):
    proc = _holder(tmp_path)
    try:
        monkeypatch.setenv("RANK", "1")
        with output_dir_lock(tmp_path):  # rank 1 of the holder's own launch is not refused
            pass
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_second_training_into_a_held_folder_exits_2_with_one_line(tmp_path):
    """The real command: refused before any model loads, one line naming --output_dir, exit 2."""
    out = tmp_path / "run"
    out.mkdir()
    proc = _holder(out)
    try:
        cmd = [sys.executable, "-m", "atr_llm.train", "--config", "atr_llm/configs/cpu-tiny.yaml", "--output_dir"]
        t0 = time.time()
        done = subprocess.run([*cmd, str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert done.returncode == 2, done.stderr[-2000:]
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert lines[-1].startswith(f"error: --output_dir {out}: another training (pid {proc.pid})"), lines
        assert "Traceback" not in done.stderr and not (out / "sft").exists() and time.time() - t0 < 300
    finally:
        proc.kill()
        proc.wait()
