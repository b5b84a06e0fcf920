"""keep_freed_memory: a freed large block is reused instead of being faulted in again (glibc)."""

import subprocess
import sys

import pytest

CODE = """
import resource, sys, torch
from specdiff.memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory() and keep_freed_memory()  # idempotent
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
late = 0
for step in range(16):  # a training loop's pattern: a large block used, a small result kept, the block freed
    before = faults()
    x = torch.empty(64 * 2**20 // 4).fill_(1.0)  # 64 MB, every page touched
    y = x.sum()
    del x
    late += faults() - before if step >= 12 else 0
print(late)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_large_blocks_are_reused_not_faulted_in_again():
    def second_allocation_faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    default, kept = second_allocation_faults("default"), second_allocation_faults("keep")
    assert default > 40_000  # 4 x 16384 pages of 4 KB: mmap'd afresh and zeroed by the kernel every step
    assert kept < default / 10  # the heap's free blocks are reused once it has grown
