"""The first run on a GPU: the ``gpu`` tests and the bench ratios, one command, a small report (docs/gpu.md).

    python jobs/gpu_check.py --out gpu-check            # ~5-8 minutes on one GPU; exit 2 at once without CUDA

1. ``pytest -m gpu tests/test_gpu.py`` (T=0 identity tiny and default verifier, float32 and bf16, both forwards;
   tree pass against a plain step; a short distillation run; vLLM dflash with our export where vLLM is installed);
2. ``jobs/bench.py --untrained`` on a few prompts (plain against our engine with an untrained feature drafter, and
   the default drafter where it is built), on the GPU, in the bench's dtype (auto: bf16 on a GPU).

Writes ``gpu_check.md`` and ``gpu_check.json`` (device, versions, every test's outcome and printed figures, the bench's
speed-ups) plus the raw logs under ``--out``. Exit 0 when every test passed or was skipped and the bench ran, else 1.
``SPECDIFF_GPU_TESTS_ON=cpu`` runs the same on the CPU (checks this script; proves nothing about CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NO_CUDA = "error: no CUDA device here (torch.cuda.is_available() is False); jobs/gpu_check.py runs on a GPU machine"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the report and logs")
    p.add_argument("--tests-timeout", type=int, default=420, help="seconds for the gpu tests (default %(default)s)")
    p.add_argument("--bench-timeout", type=int, default=150, help="seconds for the bench (default %(default)s)")
    p.add_argument("--tests-k", default=None, metavar="EXPR", help="only the gpu tests matching this pytest -k "
                   "expression (a rerun of some)")
    p.add_argument("--prompts-per-set", type=int, default=1, help="bench prompts per prompt set")
    p.add_argument("--max-new-tokens", type=int, default=64)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    on_cpu = os.environ.get("SPECDIFF_GPU_TESTS_ON") == "cpu"
    if not on_cpu and not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "platform"),
                                                                      os.environ.get("PYTHONPATH")]))}
    report = {"device": device_facts(torch, on_cpu), "started": time.strftime("%Y-%m-%d %H:%M:%S")}

    t0 = time.perf_counter()
    junit = out / "junit.xml"
    tests = run([sys.executable, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-s", "-p", "no:cacheprovider",
                 f"--junitxml={junit}", "-o", "addopts=-ra", *(["-k", args.tests_k] if args.tests_k else [])],
                out / "pytest.log", args.tests_timeout, env)
    report["tests"] = {"rc": tests, "seconds": round(time.perf_counter() - t0, 1), "cases": read_junit(junit),
                       "printed": figures(out / "pytest.log")}

    t0 = time.perf_counter()
    bench_out = out / "bench"
    from specdiff.models.sources import state_dir

    cmd = [sys.executable, "jobs/bench.py", "--untrained", "--prompts-per-set", str(args.prompts_per_set),
           "--max-new-tokens", str(args.max_new_tokens), "--k", "1", "4", "--draft-temperatures", "1.5",
           "--temperatures", "0", "--out", str(bench_out)]
    default = state_dir() / "drafters" / "default"
    if default.is_dir():
        cmd += ["--drafter", f"default={default}"]
    bench = run(cmd, out / "bench.log", args.bench_timeout, env)
    report["bench"] = {"rc": bench, "seconds": round(time.perf_counter() - t0, 1), **bench_summary(bench_out)}
    ok = tests == 0 and bench == 0
    report["ok"] = ok
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    (out / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if ok else 1


def device_facts(torch, on_cpu: bool) -> dict:
    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "on": "cpu (SPECDIFF_GPU_TESTS_ON=cpu)" if on_cpu
             else "cuda"}
    if not on_cpu:
        props = torch.cuda.get_device_properties(0)
        facts.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                     capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported(),
                     count=torch.cuda.device_count())
    return facts


def run(cmd: list[str], log: Path, timeout: int, env: dict) -> int:
    """The command's exit status (124 when it ran past ``timeout``), its output in ``log``."""
    with log.open("w") as f:
        try:
            return subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            f.write(f"\n[gpu_check] timed out after {timeout} s\n")
            return 124


def read_junit(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                outcome += f": {(node.get('message') or '').splitlines()[0][:200]}" if node.get("message") else ""
                break
        cases.append({"test": case.get("name"), "outcome": outcome, "seconds": float(case.get("time") or 0)})
    return cases


def figures(log: Path) -> list[str]:
    """The lines the tests print (identity counts and margins, the tree/plain ratio, the distillation run)."""
    keys = ("outputs differ", "ratio", "distillation on")
    lines = log.read_text().splitlines() if log.is_file() else []
    return [re.sub(r"^\S+\.py\s+", "", line.strip().lstrip(".")) for line in lines if any(k in line for k in keys)]


def bench_summary(folder: Path) -> dict:
    path = folder / "bench.json"
    if not path.is_file():
        return {"table": None}
    report = json.loads(path.read_text())
    return {"table": report.get("table"), "dtype": report.get("settings", {}).get("dtype")}


def markdown(report: dict) -> str:
    d = report["device"]
    lines = [f"# GPU check ({report['started']})", "",
             f"device: {d.get('name', d['on'])} ({d.get('memory_gib', '?')} GiB, capability {d.get('capability', '?')},"
             f" bf16 {d.get('bf16', '?')}); torch {d['torch']}, CUDA {d['cuda']}", "",
             f"## gpu tests (rc {report['tests']['rc']}, {report['tests']['seconds']} s)", "",
             "| test | outcome | s |", "|---|---|---|"]
    lines += [f"| {c['test']} | {c['outcome']} | {c['seconds']:.1f} |" for c in report["tests"]["cases"]]
    lines += ["", *[f"- {line}" for line in report["tests"]["printed"]], "",
              f"## bench (rc {report['bench']['rc']}, {report['bench']['seconds']} s)", "",
              report["bench"].get("table") or "(no bench table: see bench.log)", "",
              f"ok: {report['ok']}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # vLLM (the dflash test) spawns engine processes
    sys.exit(main())
