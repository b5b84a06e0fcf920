"""keep_freed_memory / KEEP_FREED_ENV: a freed large block is reused instead of being faulted in again (glibc)."""

import os
import subprocess
import sys

import pytest

# A training loop's pattern, run in a thread as Ray Train runs one: a large block used, a small result kept, the
# block freed; the page faults of the last 4 of 16 steps are printed. 48 MB: a thread's arena holds blocks under
# 64 MB (its heap size); training keeps its tensors that small (objectives.HEAD_CHUNK_BYTES).
CODE = """
import resource, sys, threading, torch
from specdiff.runtime.memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory() and keep_freed_memory()  # idempotent
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def loop():
    late = 0
    for step in range(16):
        before = faults()
        x = torch.empty(48 * 2**20 // 4).fill_(1.0)  # 48 MB, every page touched
        y = x.sum()
        del x
        late += faults() - before if step >= 12 else 0
    print(late)
thread = threading.Thread(target=loop)
thread.start()
thread.join()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_large_blocks_are_reused_not_faulted_in_again():
    from specdiff.runtime.memory import KEEP_FREED_ENV

    def late_faults(mode: str) -> int:
        env = {**os.environ, **(KEEP_FREED_ENV if mode == "env" else {})}
        out = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, check=True, env=env)
        return int(out.stdout.split()[-1])

    default = late_faults("default")
    assert default > 40_000  # 4 x 12288 pages of 4 KB: mmap'd afresh and zeroed by the kernel every step
    assert late_faults("keep") < default / 10  # mallopt before the thread starts
    assert late_faults("env") < default / 10  # the environment a Ray worker starts with
